"""Under CI=true a skipped test fails; on a laptop it stays a skip."""

from __future__ import annotations

import pytest

# A conftest that loads only the CI-strict hook.
STRICT = "pytest_plugins = ['tests.support.ci_strict']"


@pytest.mark.parametrize("ci, outcome", [("true", {"failed": 1}), ("", {"skipped": 1})])
def test_skip_becomes_failure_only_in_ci(pytester, monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(STRICT)
    pytester.makepyfile("import pytest\n\ndef test_needs_slurm():\n"
                        "    pytest.skip('slurmctld is not running')\n")
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(**outcome)
    if ci:
        result.stdout.fnmatch_lines(["*skipped under CI=true*slurmctld is not running*"])


def test_expected_failures_are_left_alone(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    pytester.makeconftest(STRICT)
    pytester.makepyfile("import pytest\n\n@pytest.mark.xfail(strict=True)\n"
                        "def test_known_bug():\n    assert False\n")
    pytester.runpytest_inprocess().assert_outcomes(xfailed=1)
