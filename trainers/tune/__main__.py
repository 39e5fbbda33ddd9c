"""``python -m trainers.tune``: :func:`trainers.tune.search.main`."""

from trainers.tune.search import main

main()
