"""The step labels of the agents' step-by-step benchmarks (bench/bench_deepspeed_agent.py,
bench/bench_fsdp_agent.py), one rule for every example that has --toggle K and
--toggle-method (deepspeed_stories.py, hf_stories.py, fsdp_stories.py)."""
import random

METHODS = ("switch", "both", "control")
METHOD_HELP = ("with --toggle: switch (resume before an observed block, pause before a paused "
               "one), both (before every step, pause and resume in the order that leaves the "
               "step's state: every step follows the same two switches), control (the steps "
               "labelled as by switch, never paused)")


def toggle_step(step, k, method, agent):
    """Whether the agent observes this step, having paused or resumed it as the method says
    (agent: shardscope.deepspeed or shardscope.fsdp; None labels only, as for a run without
    the agent). Blocks of K steps in pairs, one observed and one paused; which comes first is
    drawn for each pair by a generator seeded with the pair's number (the same on every rank),
    so that nothing periodic in the steps lines up with the labels: a fixed order (on off, off
    on, ...) put about 1 % between the labels alone (docs/performance.md, section 10)."""
    pair, second = divmod(step // k, 2)
    observed = (random.Random(pair).random() < 0.5) != bool(second)
    if agent is None:
        return observed
    pause, resume = agent.pause, agent.resume
    if method == "both":
        (pause if observed else resume)()
    if method != "control":
        (resume if observed else pause)()
    return observed
