"""What a lent accelerator runs: `quality_run.sh` (the teacher, the student, their scores) and its summary."""
