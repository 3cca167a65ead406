"""Runs a function on P processes joined by gloo on this machine, as torchrun would."""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(world_size: int, worker, *args, backend: str = "gloo") -> None:
    """``worker(*args)`` on every rank; an exception on any rank fails the call with its traceback.
    With ``backend="nccl"`` rank r works on GPU r."""
    mp.spawn(_entry, args=(world_size, free_port(), backend, worker, args), nprocs=world_size, join=True)


def _entry(rank: int, world_size: int, port: int, backend: str, worker, args) -> None:
    # Several ranks share the test machine's cores: a team of threads per rank would oversubscribe them.
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        worker(*args)
    finally:
        dist.destroy_process_group()
    # A rank whose work passed ends here, without the interpreter's teardown: on a 2-core machine
    # (torch 2.13, gloo) that teardown aborted a finished rank ("terminate called without an active
    # exception", no Python frame) in about half of the runs, after every check had passed and
    # the group was destroyed. A failing rank still raises above, and spawn reports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
