"""test_db_tls.py -- TLS on moatd's PostgreSQL proxy (moatd --db-tls-cert/--db-tls-key).

With a certificate (self-signed here, made by the host's openssl): psql with sslmode=require and
with sslmode=verify-full (the certificate as root, host name checked) connects, writes and reads
through the proxy, and libpq reports the connection encrypted (PQsslInUse) with TLS 1.2 or later;
sslmode=disable still works beside it. Without one, sslmode=require is refused by the client
("server does not support SSL") and sslmode=prefer falls back. A TLS client hello where a startup
packet belongs is closed. Bad flags: a certificate without its key, a key that is not the
certificate's, a file that does not exist: moatd refuses to start and names it."""

import ctypes
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
from moattest import DaemonTest  # noqa: E402
from test_databases import DatabaseMixin  # noqa: E402

CERTS = tempfile.mkdtemp(prefix="moat-db-tls-")


def make_cert(name, cn="localhost"):
    cert, key = os.path.join(CERTS, name + ".pem"), os.path.join(CERTS, name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-subj", "/CN=" + cn, "-addext", "subjectAltName=DNS:%s,IP:127.0.0.1" % cn, "-days", "2",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


CERT, KEY = make_cert("proxy")
OTHER_CERT, OTHER_KEY = make_cert("other")


def tearDownModule():
    shutil.rmtree(CERTS, ignore_errors=True)


def url_with(d, **params):
    base = d["connection"]["url"].split("?")[0]
    return base + "?" + "&".join("%s=%s" % kv for kv in params.items())


class DbTlsTest(DatabaseMixin, DaemonTest):
    pool = 0

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=0, extra_args=["--db-tls-cert", CERT, "--db-tls-key", KEY])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.c = cls.daemon.client

    def test_psql_over_tls(self):
        d = self.database()
        self.host_psql(d, "CREATE TABLE t (s text)", url=url_with(d, sslmode="require"))
        self.host_psql(d, "INSERT INTO t VALUES ('over tls')",
                       url=url_with(d, sslmode="verify-full", sslrootcert=CERT).replace("127.0.0.1", "localhost"))
        # plain text still works beside it
        self.assertEqual(self.host_psql(d, "SELECT s FROM t", url=url_with(d, sslmode="disable")).stdout, "over tls\n")
        # a certificate the client does not trust is refused by the client
        r = self.host_psql(d, "SELECT 1", url=url_with(d, sslmode="verify-full", sslrootcert=OTHER_CERT).replace(
            "127.0.0.1", "localhost"), check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("certificate verify failed", r.stderr)

    def test_libpq_reports_encryption(self):
        d = self.database()
        pq = ctypes.CDLL("libpq.so.5")
        pq.PQconnectdb.restype = ctypes.c_void_p
        pq.PQconnectdb.argtypes = [ctypes.c_char_p]
        for f in ("PQstatus", "PQsslInUse"):
            getattr(pq, f).argtypes = [ctypes.c_void_p]
        pq.PQsslAttribute.restype = ctypes.c_char_p
        pq.PQsslAttribute.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        pq.PQerrorMessage.restype = ctypes.c_char_p
        pq.PQerrorMessage.argtypes = [ctypes.c_void_p]
        pq.PQfinish.argtypes = [ctypes.c_void_p]
        for mode, want in (("require", 1), ("disable", 0)):
            conn = pq.PQconnectdb(url_with(d, sslmode=mode).encode())
            try:
                self.assertEqual(pq.PQstatus(conn), 0, pq.PQerrorMessage(conn))
                self.assertEqual(pq.PQsslInUse(conn), want, mode)
                if want:
                    self.assertIn(pq.PQsslAttribute(conn, b"protocol"), (b"TLSv1.2", b"TLSv1.3"))
            finally:
                pq.PQfinish(conn)

    def test_tls_hello_instead_of_a_startup_is_closed(self):
        port = self.daemon.db_port
        s = socket.create_connection(("127.0.0.1", port), 10)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            with ctx.wrap_socket(s, server_hostname="localhost") as t:
                t.recv(1)
        # the proxy serves on
        d = self.database()
        self.host_psql(d, "SELECT 1", url=url_with(d, sslmode="require"))


class DbNoTlsTest(DatabaseMixin, DaemonTest):
    pool = 0

    def test_require_is_refused_prefer_falls_back(self):
        d = self.database()
        r = self.host_psql(d, "SELECT 1", url=url_with(d, sslmode="require"), check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("server does not support SSL", r.stderr)
        self.assertEqual(self.host_psql(d, "SELECT 1", url=url_with(d, sslmode="prefer")).stdout, "1\n")


class DbTlsFlagsTest(unittest.TestCase):
    def refused(self, args, want):
        d = moatd.MoatDaemon(pool=0, extra_args=args)
        self.addCleanup(d.stop)
        with self.assertRaises(Exception):
            d.start()
        self.assertIn(want, d.log_tail(200))

    def test_bad_flags(self):
        self.refused(["--db-tls-cert", CERT], "--db-tls-cert and --db-tls-key go together")
        self.refused(["--db-tls-cert", CERT, "--db-tls-key", OTHER_KEY], "does not belong to certificate")
        self.refused(["--db-tls-cert", "/nonexistent/cert.pem", "--db-tls-key", KEY], "/nonexistent/cert.pem")
        self.refused(["--db-listen", "none", "--db-tls-cert", CERT, "--db-tls-key", KEY], "no database proxy")


if __name__ == "__main__":
    unittest.main()
