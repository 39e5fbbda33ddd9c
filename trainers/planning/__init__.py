"""Will a job fit, and how to split it: the planner and the plan and memory commands. Imports no
torch."""
