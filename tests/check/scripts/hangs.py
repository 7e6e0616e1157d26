"""Never reaches a step: waits forever (a dataloader that never yields, say)."""
import time

import deepspeed  # noqa: F401

while True:
    time.sleep(1)
