"""``python -m trainers.scaling``: :func:`trainers.scaling.measure.main`."""

from trainers.scaling.measure import main

main()
