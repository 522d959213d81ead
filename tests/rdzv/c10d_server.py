"""Serves torch c10d TCPStores for test_c10d_store: one on torch's libuv backend and one
on its classic backend, each on a free port of 127.0.0.1, and prints

    libuv PORT
    classic PORT

Then, on each store, a client of torch's own (as a trainer under torchrun would use)
sets "interop/from-torch" and, once sx has set "interop/from-sx", copies its value to
"interop/seen-by-torch": the keys and bytes sx writes are the ones torch reads.

Runs until its standard input closes (the test exited, or was killed).
usage: c10d_server.py
"""
import datetime
import sys
import threading

import torch.distributed as dist


def serve(use_libuv):
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, use_libuv=use_libuv,
                           wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    if server.libuvBackend != use_libuv:
        raise SystemExit(f"asked for use_libuv={use_libuv}, got libuvBackend={server.libuvBackend}")
    return server


def interop(port):
    client = dist.TCPStore("127.0.0.1", port, 1, is_master=False, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=600))
    client.set("interop/from-torch", "hello from torch")
    client.set("interop/seen-by-torch", client.get("interop/from-sx"))


def main():
    stores = {"libuv": serve(True), "classic": serve(False)}
    for name, store in stores.items():
        print(name, store.port, flush=True)
        threading.Thread(target=interop, args=(store.port,), daemon=True).start()
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
