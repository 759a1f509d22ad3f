#!/usr/bin/env bash
# A device call's time budget: the moment its steps must stop by, and the seconds left until then.
#
#   source scripts/device/deadline.sh SECONDS     (repository root; SECONDS from now)
#
# Sets deadline (epoch seconds) and left(), which prints the seconds until it, at least 1: the value for
# `timeout "$(left)" ...`, so each step gets what the earlier ones left.
deadline=$(( $(date +%s) + ${1:?usage: source scripts/device/deadline.sh SECONDS} ))
left() { echo $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )); }
