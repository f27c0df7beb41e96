"""Outcome recording and replay: read and switch a breaker's sampled outcomes
(`control`), their JSONL form (`timeline`), and replaying a timeline against candidate
configs on the real scripts (`replay_core`: pure accounting; `replay`: the runs)."""
