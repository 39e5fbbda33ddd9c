"""Will scaling pay: the runs at 1 process, one node and N nodes, the report and its figure."""
