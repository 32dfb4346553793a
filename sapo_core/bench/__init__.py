"""`sapo-bench`: speed and memory goals, measured side by side in one run."""
