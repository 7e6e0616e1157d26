"""Calls sys.exit(3) before its first step, after deepspeed.init_distributed."""
import sys

import deepspeed

deepspeed.init_distributed("gloo")
sys.exit(3)
