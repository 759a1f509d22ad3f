# Sourced by scripts that run two jobs side by side (one per GPU): sets the arrays PIN0 and PIN1 to the
# taskset prefixes that pin a job to the first or the second half of this machine's cores (empty where
# taskset is missing or there is a single core), so neither job's host work slows the other's.
PIN0=(); PIN1=()
_cores=$(nproc)
if command -v taskset > /dev/null && [ "$_cores" -gt 1 ]; then
  PIN0=(taskset -c "0-$(( _cores / 2 - 1 ))")
  PIN1=(taskset -c "$(( _cores / 2 ))-$(( _cores - 1 ))")
fi
unset _cores
