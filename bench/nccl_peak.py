#!/usr/bin/env python3
"""The GPU link's peak for the KV link's NCCL plane (issue 20): one process per GPU, torch.distributed with
NCCL, rank 0 sends --bytes to rank 1 (send/recv, as Loom's plane does), median of --repeat after warm-ups.
Runs on the GPU machine as is (PyTorch there).

  python3 bench/nccl_peak.py --bytes 1073741824 --out nccl_peak.json
"""
import argparse
import json
import os
import socket
import time


def worker(rank, args, port, results):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    data = torch.empty(args.bytes, dtype=torch.uint8, device="cuda")
    seconds = []
    for i in range(args.warmup + args.repeat):
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(data, 1)
        else:
            dist.recv(data, 0)
        torch.cuda.synchronize()
        if i >= args.warmup:
            seconds.append(time.perf_counter() - start)
    if rank == 1:
        seconds.sort()
        median = seconds[len(seconds) // 2]
        results.put({"bytes": args.bytes, "median_seconds": median, "gb_per_second": args.bytes / median / 1e9,
                     "gpus": [torch.cuda.get_device_name(0), torch.cuda.get_device_name(1)],
                     "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=worker, args=(rank, args, port, results)) for rank in (0, 1)]
    for process in processes:
        process.start()
    result = results.get(timeout=300)
    for process in processes:
        process.join()
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
