"""The fault-injection suite: envs that fail on purpose, over every backend and front end."""
