"""A real S3 server over HTTP on loopback (moto's server mode) for tests and the local stack.

    python -m infra.local_s3 --port 5055 --bucket lake        # runs until Ctrl-C

Prints the endpoint and the environment to export. pyarrow's C++ S3 client and Ray workers
talk to it over HTTP like to any S3, which an in-process mock could not serve.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from memagent.net import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


@contextmanager
def s3_server(port: int | None = None, buckets: tuple[str, ...] = ("lake",)) -> Iterator[str]:
    """Start moto's threaded S3 server on 127.0.0.1, create ``buckets``, yield the endpoint URL.

    Each server starts empty: moto keeps its buckets in process-wide state, which another server
    started earlier in the same process (the previous test) would otherwise still show.
    """
    import urllib.request

    import boto3
    from moto.server import ThreadedMotoServer

    port = port or free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                              region_name=CREDENTIALS["AWS_REGION"])
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


def wait_until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM (the infra servers run in the foreground)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5055)
    parser.add_argument("--bucket", action="append", default=None, help="bucket to create (repeatable)")
    args = parser.parse_args()
    os.environ.update({k: os.environ.get(k, v) for k, v in CREDENTIALS.items()})
    with s3_server(args.port, tuple(args.bucket or ["lake"])) as endpoint:
        print(f"S3 endpoint: {endpoint}  buckets: {', '.join(args.bucket or ['lake'])}")
        print(f"export AWS_ENDPOINT_URL={endpoint} " + " ".join(f"{k}={v}" for k, v in CREDENTIALS.items()))
        wait_until_stopped()


if __name__ == "__main__":
    main()
