"""Fails before any model exists (a config file that is not there)."""
import deepspeed  # noqa: F401

open("/nonexistent/ds_config.json").read()
