"""``python -m tests.support.workers.start_method``: prints multiprocessing's start method, the
one a DataLoader's workers and any other child process of the run would start with."""

import multiprocessing

if __name__ == "__main__":
    print(multiprocessing.get_start_method())
