"""Stamps when each TLS socket read returns: httpcore's sync backend reads TLS with
SSLSocket.recv. `timed_tls.last_read_ns` is the CLOCK_MONOTONIC time (ns) of the
last read that returned, as the lab's bench times its events.
"""
import ssl
import time

_recv = ssl.SSLSocket.recv
last_read_ns = 0


def _timed_recv(self, *args, **kwargs):
    global last_read_ns
    data = _recv(self, *args, **kwargs)
    last_read_ns = time.monotonic_ns()
    return data


ssl.SSLSocket.recv = _timed_recv
