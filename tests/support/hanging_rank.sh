#!/usr/bin/env bash
# A rank that hangs as a broken training script does, for tst_rankjob: it ignores SIGTERM and
# SIGINT, starts a child of its own (in its process group, ignoring them too), writes
# "<its pid> <the child's pid>" to $1/rank$RANK.pids and loops forever.
trap '' TERM INT
sleep 100000 &
echo "$$ $!" > "$1/rank$RANK.pids"
while :; do sleep 0.2; done
