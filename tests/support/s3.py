"""A real S3 endpoint for the tests: moto's server mode (``ThreadedMotoServer``, an HTTP S3
API on 127.0.0.1), one per test session, and a fresh bucket per test.

The ``s3`` fixture points this process and every process the tests start (their environment
is this one's: :func:`tests.support.runs.child_env`) at the server through the standard
variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``), exactly as a user points the trainers at MinIO or on-prem S3.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

REGION = "us-east-1"


@dataclass(frozen=True)
class Bucket:
    """A bucket on the test session's S3 server."""

    name: str
    endpoint: str

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts...>``."""
        return "/".join([f"s3://{self.name}", *parts])

    @property
    def env(self) -> dict[str, str]:
        """The variables that point a process at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``, sorted (listed through boto3, not the code
        under test)."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.name,
                                                                  Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server running for the whole session on 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A new, empty bucket; this process and its children point at the server."""
    import boto3

    bucket = Bucket(f"runs-{uuid.uuid4().hex[:12]}", s3_endpoint)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION).create_bucket(
        Bucket=bucket.name)
    return bucket
