"""The 1-bit exchange's collectives alone, without a model: how long the link takes for a step's bytes.

One process per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment, as
sync_1bit.py's launch sets them), Gloo. Each step sends what the two-phase exchange of
tscale/dist/onebit.py sends for `--params` gradients in `--buckets` buckets: per bucket, padded
to a multiple of world x `--chunk` values, an all-to-all of the packed signs and scales (each
rank's slice of S values: S / 8 bytes of signs and 4 S / chunk of scales), then an all-gather of
this rank's packed slice on a second group. Rank 0 prints each step's seconds and the median. In the
namespaces of scripts/bench/netns_1gbit.sh (4 hosts, 1 Gbit/s):

    scripts/bench/netns_1gbit.sh up 4
    for k in 0 1 2 3; do RANK=$k WORLD_SIZE=4 MASTER_ADDR=10.77.0.1 MASTER_PORT=29600 GLOO_SOCKET_IFNAME=eth0 \\
      scripts/bench/netns_1gbit.sh exec $k python scripts/bench/onebit_link_probe.py & done; wait
    scripts/bench/netns_1gbit.sh down
"""

import argparse
import datetime
import statistics
import time

import torch
import torch.distributed as dist


def slice_bytes(params: int, buckets: int, world: int, chunk: int) -> int:
    """Bytes of one rank's packed slice of one bucket, as the exchange sends it (GradExchange.padded, _packed_bytes)."""
    n = -(-params // buckets)
    unit = world * chunk
    S = -(-n // unit) * unit // world
    return S // 8 + 4 * (S // chunk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=49_596_800, help="gradients exchanged per step")
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=2048, help="values per scale (dist.chunk)")
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    world, rank = dist.get_world_size(), dist.get_rank()
    gather_group = dist.new_group(backend="gloo")
    part = slice_bytes(args.params, args.buckets, world, args.chunk)
    times = []
    for step in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.buckets):
            send = torch.randint(0, 256, (world * part,), dtype=torch.uint8)  # (W * part,)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send)
            gathered = torch.empty_like(send)
            dist.all_gather_into_tensor(gathered, recv[:part].clone(), group=gather_group)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step}: {times[-1]:.3f} s", flush=True)
    if rank == 0:
        median = statistics.median(times[1:])  # the first step opens the connections
        print(f"{world} ranks, {args.params:,} gradients in {args.buckets} buckets: median {median:.3f} s a step, "
              f"{2 * (world - 1) * part * args.buckets:,} bytes sent per rank", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
