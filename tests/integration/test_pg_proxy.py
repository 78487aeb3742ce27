"""test_pg_proxy.py -- the PostgreSQL-protocol proxy (moatd --db-listen; api/pg).

ProxyInMoatdTest drives the proxy of a real moatd (no database resource yet: its resolver answers
every startup 3D000 "no such database"): garbage, HTTP, a TLS ClientHello without SSLRequest and a
startup packet over 10,000 bytes are closed with nothing sent; malformed startup packets get an
ErrorResponse with their SQLSTATE; SSLRequest is answered 'N' (psql sslmode=require fails,
sslmode=prefer goes on in plaintext); a client address over --db-max-conns-per-ip gets 53300 while
another address is served; after each, moatd's proxy and API still serve.

ProxyToPostgresTest drives the same proxy code in tests/lib/pg_harness (a resolver that routes
"alice" to a real PostgreSQL 15 it starts, scram-sha-256) with real clients: psql and libpq (ctypes)
run queries through it, SCRAM passes end to end (a wrong password is the server's 28P01), a
PQcancel reaches the right server (57014) while a CancelRequest with a wrong key is dropped, 200
concurrent connections all work and leave nothing behind (proxy and server), 1,000 connections
from one address do not keep another address from being served, a client that sends nothing is
closed after the startup deadline, and stopping the proxy closes routed connections.

ScopedListenerTest: the harness's scoped listener (moatd's in-sandbox one; there each sandbox
address maps to its sandbox's org) maps 127.0.0.1 to the database's org, 127.0.0.3 to another and
127.0.0.4 to none: the first is served (psql), the others get the very ErrorResponse an unknown
database gets, with the right credentials; a CancelRequest with the right key from another org's
address is dropped while the same from the right org's cancels; the scoped listener's per-address
cap is its own (the main listener full from one address leaves that address served on the scoped
one).
"""

import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import moatd  # noqa: E402
import pgtest  # noqa: E402
from pgtest import read_error, startup_packet  # noqa: E402

PER_IP = 4
GLOBAL_CAP = 600  # the harness's: below the 1,000 connections one address opens


def connect(port, src="127.0.0.1", timeout=10):
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_silently(s, timeout=15):
    """True when the peer closes s (FIN or reset) having sent nothing."""
    _, data = read_error(s, timeout)
    return data == b""


def psql(port, user, db, sql, password="x", sslmode="disable", timeout=60):
    return subprocess.run(["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-d", db, "-Atc", sql],
                          env=dict(os.environ, PGPASSWORD=password, PGSSLMODE=sslmode, PGCONNECT_TIMEOUT="20"),
                          capture_output=True, timeout=timeout)


class ProxyInMoatdTest(unittest.TestCase):
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = moatd.MoatDaemon(pool=0, extra_args=["--db-max-conns-per-ip", str(PER_IP)])
        try:
            cls.daemon.start()
        except Exception:
            cls.daemon.stop()
            raise
        cls.port = cls.daemon.db_port

    @classmethod
    def tearDownClass(cls):
        if cls.daemon is not None:
            cls.daemon.stop()

    def assert_serving(self):
        """The proxy answers a well-formed startup (3D000: no database resource here) and the API is up."""
        s = connect(self.port)
        s.sendall(startup_packet({"user": "nobody-here", "database": "nothing"}))
        f, _ = read_error(s)
        s.close()
        self.assertIsNotNone(f, "the proxy answered no ErrorResponse")
        self.assertEqual(f.get("C"), "3D000", f)
        self.assertIn("no such database", f.get("M", ""))
        self.daemon.client.healthz()

    def test_no_such_database_psql(self):
        r = psql(self.port, "ghost", "ghost", "select 1")
        self.assertEqual(r.returncode, 2, r)
        self.assertIn(b'no such database: user "ghost", database "ghost"', r.stderr)

    def test_ssl_request_answered_n(self):
        s = connect(self.port)
        s.sendall(struct.pack("!II", 8, 80877103))
        self.assertEqual(s.recv(1), b"N")
        s.sendall(struct.pack("!II", 8, 80877104))  # then GSSENCRequest: also N
        self.assertEqual(s.recv(1), b"N")
        s.sendall(struct.pack("!II", 8, 80877103))  # a second SSLRequest: protocol violation
        f, _ = read_error(s)
        s.close()
        self.assertEqual(f and f.get("C"), "08P01", f)
        r = psql(self.port, "ghost", "ghost", "select 1", sslmode="require")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"server does not support SSL", r.stderr)
        r = psql(self.port, "ghost", "ghost", "select 1", sslmode="prefer")
        self.assertIn(b"no such database", r.stderr)
        self.assert_serving()

    def test_garbage_http_tls_oversized_closed(self):
        tls_hello = bytes([0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03]) + os.urandom(160)
        cases = {
            "garbage": os.urandom(64),
            "http": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
            "tls": tls_hello,
            "oversized": struct.pack("!II", 10001, 196608) + b"user\0u\0" + b"x" * 9990,
            "tiny": struct.pack("!I", 4),
        }
        for name, data in cases.items():
            with self.subTest(name):
                s = connect(self.port)
                try:
                    s.sendall(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.assertTrue(closed_silently(s), "%s: not closed silently" % name)
                s.close()
        self.assert_serving()

    def test_malformed_startup_error_response(self):
        cases = {
            "v2": (startup_packet({"user": "u"}, version=2 << 16), "0A000"),
            "nouser": (startup_packet({"database": "d"}), "28000"),
            "repeated": (struct.pack("!II", 8 + 14, 196608) + b"user\0a\0user\0b\0", "08P01"),
            "long-db": (startup_packet({"user": "u", "database": "d" * 64}), "3D000"),
            "cut-cancel": (struct.pack("!III", 12, 80877102, 1), "08P01"),
        }
        for name, (data, code) in cases.items():
            with self.subTest(name):
                s = connect(self.port)
                s.sendall(data)
                f, _ = read_error(s)
                s.close()
                self.assertEqual(f and f.get("C"), code, (name, f))
        # the largest startup accepted: 10000 bytes, answered as any other (no such database)
        pkt = startup_packet({"user": "u", "x": "v" * (10000 - 8 - 7 - 2 - 2)})
        self.assertEqual(len(pkt), 10000)
        s = connect(self.port)
        s.sendall(pkt)
        f, _ = read_error(s)
        s.close()
        self.assertEqual(f and f.get("C"), "3D000", f)
        # a cancel with a key no connection has: dropped, nothing answered
        s = connect(self.port)
        s.sendall(struct.pack("!IIII", 16, 80877102, 1234, 5678))
        self.assertTrue(closed_silently(s))
        s.close()
        self.assert_serving()

    def test_per_address_cap(self):
        held = [connect(self.port) for _ in range(PER_IP)]  # in their startup: each holds a slot
        try:
            time.sleep(0.3)
            s = connect(self.port)
            s.sendall(startup_packet({"user": "u"}))
            f, _ = read_error(s)
            s.close()
            self.assertEqual(f and f.get("C"), "53300", f)
            self.assertIn("too many connections", f.get("M", ""))
            # another address is served meanwhile
            s = connect(self.port, src="127.0.0.2")
            s.sendall(startup_packet({"user": "u"}))
            f, _ = read_error(s)
            s.close()
            self.assertEqual(f and f.get("C"), "3D000", f)
        finally:
            for h in held:
                h.close()
        deadline = time.time() + 15
        while True:  # the held slots are given back
            s = connect(self.port)
            s.sendall(startup_packet({"user": "u"}))
            f, _ = read_error(s)
            s.close()
            if f and f.get("C") == "3D000":
                break
            self.assertLess(time.time(), deadline, "the address's slots were not given back: %s" % f)
            time.sleep(0.2)


@unittest.skipIf(pgtest.available(), pgtest.available() or "")
class ProxyToPostgresTest(unittest.TestCase):
    pg = None
    proxy = None

    @classmethod
    def setUpClass(cls):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 4096:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
        cls.pg = pgtest.PostgresServer(max_connections=300)
        try:
            cls.pg.start()
            cls.proxy = pgtest.ProxyHarness(cls.pg.port, "alice", "--max-connections", str(GLOBAL_CAP),
                                            "--max-conns-per-ip", "250",
                                            "--startup-timeout-ms", "1500").start()
        except Exception:
            cls.tearDownClass()
            raise
        cls.pq = pgtest.Libpq()
        cls.dsn = "host=127.0.0.1 port=%d user=alice dbname=alice password=alice-secret sslmode=disable " \
                  "connect_timeout=20" % cls.proxy.port

    @classmethod
    def tearDownClass(cls):
        if cls.proxy:
            cls.proxy.stop()
        if cls.pg:
            cls.pg.stop()

    def alice_backends(self):
        return int(self.pg.psql_super("select count(*) from pg_stat_activity where usename = 'alice'").strip())

    def wait_clean(self):
        s = self.proxy.wait_idle()
        self.assertEqual((s["active"], s["routed"]), (0, 0), s)
        self.assertEqual(s["plus"], s["minus"], s)
        deadline = time.time() + 20
        while self.alice_backends() and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(self.alice_backends(), 0, "server backends left behind")

    def test_psql_select_1(self):
        for mode in ("disable", "prefer"):
            r = psql(self.proxy.port, "alice", "alice", "select 1", password="alice-secret", sslmode=mode)
            self.assertEqual((r.returncode, r.stdout), (0, b"1\n"), r)
        r = psql(self.proxy.port, "alice", "alice", "select 1", password="wrong")
        self.assertEqual(r.returncode, 2)
        self.assertIn(b'password authentication failed for user "alice"', r.stderr)
        r = psql(self.proxy.port, "mallory", "alice-not", "select 1")
        self.assertIn(b"no such database", r.stderr)
        self.wait_clean()

    def test_libpq_queries(self):
        c = self.pq.connect(self.dsn)
        try:
            c.query("create table if not exists notes (id serial primary key, body text)")
            c.query("insert into notes (body) values ('%s')" % ("x" * 200000))  # > the proxy's buffers
            self.assertEqual(c.query("select length(body) from notes order by id desc limit 1"), [["200000"]])
            big = c.query("select string_agg(md5(g::text), '') from generate_series(1, 20000) g")[0][0]
            self.assertEqual(len(big), 20000 * 32)
        finally:
            c.close()
        self.wait_clean()

    def test_cancel(self):
        c = self.pq.connect(self.dsn)
        try:
            # a cancel with the right pid and a wrong key is dropped: the query runs to its end
            pid = c.backend_pid()
            out = {}

            def run(sql):
                t0 = time.time()
                try:
                    c.query(sql)
                    out["code"] = None
                except pgtest.PGError as e:
                    out["code"] = e.sqlstate
                out["s"] = time.time() - t0

            t = threading.Thread(target=run, args=("select pg_sleep(1.5)",))
            t.start()
            time.sleep(0.3)
            s = connect(self.proxy.port)
            s.sendall(struct.pack("!IIII", 16, 80877102, pid, 12345))
            self.assertTrue(closed_silently(s))
            s.close()
            t.join(30)
            self.assertIsNone(out.get("code"), out)
            # PQcancel through the proxy ends a long query with 57014 query_canceled
            t = threading.Thread(target=run, args=("select pg_sleep(60)",))
            t.start()
            time.sleep(0.5)
            self.assertTrue(c.cancel())
            t.join(30)
            self.assertFalse(t.is_alive(), "the query was not cancelled")
            self.assertEqual(out.get("code"), "57014", out)
            self.assertLess(out["s"], 30, out)
            self.assertEqual(c.query("select 2"), [["2"]])  # the connection goes on
        finally:
            c.close()
        self.assertIn("cancel forwarded to db-alice", self.proxy.log())
        self.wait_clean()

    def test_200_concurrent(self):
        n = 200
        barrier = threading.Barrier(n, timeout=120)
        results = [None] * n

        def one(i):
            try:
                c = self.pq.connect(self.dsn)
            except Exception as e:
                results[i] = "connect: %s" % e
                barrier.abort()
                return
            try:
                barrier.wait()  # all 200 open at once
                results[i] = c.query("select %d" % i)[0][0]
            except Exception as e:
                results[i] = "query: %s" % e
            finally:
                c.close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        self.assertEqual(results, [str(i) for i in range(n)])
        self.wait_clean()

    def test_1000_from_one_address(self):
        # 1,000 connections from 127.0.0.2 that never send a startup: 250 hold slots, the rest are
        # refused (without the per-address cap they would take all 600); meanwhile psql from
        # 127.0.0.1 works
        flood = []
        try:
            for _ in range(1000):
                try:
                    flood.append(connect(self.proxy.port, src="127.0.0.2"))
                except OSError:
                    break
            self.assertEqual(len(flood), 1000)
            r = psql(self.proxy.port, "alice", "alice", "select 1", password="alice-secret")
            self.assertEqual((r.returncode, r.stdout), (0, b"1\n"), r)
            s = connect(self.proxy.port, src="127.0.0.2")
            s.sendall(startup_packet({"user": "alice"}))
            f, data = read_error(s)
            s.close()
            self.assertTrue(data == b"" or (f and f.get("C") == "53300"), (f, data[:100]))
        finally:
            for s in flood:
                s.close()
        self.wait_clean()

    def test_global_cap_then_new_address_served(self):
        # the global cap full from one address: a new address is refused (53300), then served once
        # those connections close (its refusal leaves no count behind)
        h = pgtest.ProxyHarness(self.pg.port, "alice", "--max-connections", "2", "--max-conns-per-ip", "2").start()
        try:
            held = [connect(h.port) for _ in range(2)]
            time.sleep(0.3)
            s = connect(h.port, src="127.0.0.3")
            s.sendall(startup_packet({"user": "nobody"}))
            f, _ = read_error(s)
            s.close()
            self.assertEqual(f and f.get("C"), "53300", f)
            for x in held:
                x.close()
            deadline = time.time() + 15
            while True:
                s = connect(h.port, src="127.0.0.3")
                s.sendall(startup_packet({"user": "nobody"}))
                f, _ = read_error(s)
                s.close()
                if f and f.get("C") == "3D000":
                    break
                self.assertLess(time.time() - deadline, 0, "127.0.0.3 still refused: %s" % f)
                time.sleep(0.2)
        finally:
            h.stop()

    def test_startup_deadline(self):
        s = connect(self.proxy.port)
        s.sendall(b"\x00\x00")  # half a length word, then nothing
        t0 = time.time()
        self.assertTrue(closed_silently(s, timeout=20))
        self.assertLess(time.time() - t0, 15)
        s.close()

    def test_stop_closes_routed(self):
        # a proxy of its own, stopped with a routed connection open
        h = pgtest.ProxyHarness(self.pg.port, "alice").start()
        try:
            c = self.pq.connect(self.dsn.replace("port=%d" % self.proxy.port, "port=%d" % h.port))
            self.assertEqual(c.query("select 3"), [["3"]])
            self.assertEqual(h.stop(), 0)
            with self.assertRaises(pgtest.PGError):
                c.query("select 4")
            c.close()
        finally:
            h.stop()
        self.wait_clean()


class KeyRelay:
    """One TCP connection relayed to 127.0.0.1:port, reading the server's BackendKeyData on the way
    (the cancel key libpq keeps to itself)."""

    def __init__(self, port):
        self.target = port
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(1)
        self.port = self.ls.getsockname()[1]
        self.down = b""
        self.socks = []

    def start(self):
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _pump(self, a, b, record):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                if record:
                    self.down += d
                b.sendall(d)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self):
        c, _ = self.ls.accept()
        u = connect(self.target)
        u.settimeout(None)
        self.socks = [c, u]
        threading.Thread(target=self._pump, args=(u, c, True), daemon=True).start()
        self._pump(c, u, False)

    def backend_key(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            d, i = self.down, 1 if self.down[:1] == b"N" else 0
            while i + 5 <= len(d):
                t, n = d[i:i + 1], struct.unpack("!I", d[i + 1:i + 5])[0]
                if t == b"K" and i + 1 + n <= len(d):
                    return struct.unpack("!II", d[i + 5:i + 13])
                i += 1 + n
            time.sleep(0.05)
        raise AssertionError("no BackendKeyData seen: %r" % self.down[:200])

    def stop(self):
        for x in self.socks + [self.ls]:
            x.close()


class ScopedListenerTest(unittest.TestCase):
    pg = None
    proxy = None

    @classmethod
    def setUpClass(cls):
        cls.pg = pgtest.PostgresServer(max_connections=50)
        try:
            cls.pg.start()
            cls.proxy = pgtest.ProxyHarness(cls.pg.port, "alice", "--max-conns-per-ip", str(PER_IP),
                                            "--scoped-listen", "127.0.0.1:0", "--scope", "127.0.0.1=org-test",
                                            "--scope", "127.0.0.3=org-other").start()
        except Exception:
            cls.tearDownClass()
            raise
        cls.pq = pgtest.Libpq()

    @classmethod
    def tearDownClass(cls):
        if cls.proxy:
            cls.proxy.stop()
        if cls.pg:
            cls.pg.stop()

    def refusal(self, port, src, params):
        s = connect(port, src=src)
        s.sendall(startup_packet(params))
        f, data = read_error(s)
        s.close()
        self.assertIsNotNone(f, data[:100])
        return f.get("C"), f.get("M")

    def test_org_scope(self):
        sp = self.proxy.scoped_port
        r = psql(sp, "alice", "alice", "select 1", password="alice-secret")
        self.assertEqual((r.returncode, r.stdout), (0, b"1\n"), r)
        unknown = self.refusal(sp, "127.0.0.1", {"user": "nosuch", "database": "nosuch"})
        self.assertEqual(unknown, ("3D000", 'no such database: user "nosuch", database "nosuch"'))
        for src in ("127.0.0.3", "127.0.0.4"):
            got = self.refusal(sp, src, {"user": "alice", "database": "alice"})
            self.assertEqual(got, ("3D000", 'no such database: user "alice", database "alice"'), src)
            self.assertEqual(self.refusal(sp, src, {"user": "nosuch", "database": "nosuch"}), unknown, src)
        # the main listener does not scope: the same startup from 127.0.0.3 reaches the server
        s = connect(self.proxy.port, src="127.0.0.3")
        s.sendall(startup_packet({"user": "alice", "database": "alice"}))
        s.settimeout(10)
        self.assertEqual(s.recv(1), b"R")  # the server's AuthenticationSASL
        s.close()
        self.assertIn("(client of org-test)", self.proxy.log())
        self.assertIn("maps to no org", self.proxy.log())

    def test_cancel_scoped(self):
        relay = KeyRelay(self.proxy.scoped_port).start()
        dsn = "host=127.0.0.1 port=%d user=alice dbname=alice password=alice-secret sslmode=disable " \
              "connect_timeout=20" % relay.port
        c = self.pq.connect(dsn)
        try:
            pid, key = relay.backend_key()
            self.assertEqual(pid, c.backend_pid())
            out = {}

            def run(sql):
                try:
                    c.query(sql)
                    out["code"] = None
                except pgtest.PGError as e:
                    out["code"] = e.sqlstate

            # the right key from another org's address is dropped: the query runs to its end
            t = threading.Thread(target=run, args=("select pg_sleep(1.5)",))
            t.start()
            time.sleep(0.3)
            s = connect(self.proxy.scoped_port, src="127.0.0.3")
            s.sendall(struct.pack("!IIII", 16, 80877102, pid, key))
            self.assertTrue(closed_silently(s))
            s.close()
            t.join(30)
            self.assertIsNone(out.get("code"), "a cancel from another org's address reached the server")
            # the same from the database's org cancels
            t = threading.Thread(target=run, args=("select pg_sleep(60)",))
            t.start()
            time.sleep(0.5)
            s = connect(self.proxy.scoped_port, src="127.0.0.1")
            s.sendall(struct.pack("!IIII", 16, 80877102, pid, key))
            self.assertTrue(closed_silently(s))
            s.close()
            t.join(30)
            self.assertFalse(t.is_alive(), "the query was not cancelled")
            self.assertEqual(out.get("code"), "57014", out)
        finally:
            c.close()
            relay.stop()

    def test_caps_per_listener(self):
        held = []
        try:
            for _ in range(PER_IP):
                held.append(connect(self.proxy.port, src="127.0.0.1"))
            time.sleep(0.3)
            self.assertEqual(self.refusal(self.proxy.port, "127.0.0.1", {"user": "alice"})[0], "53300")
            r = psql(self.proxy.scoped_port, "alice", "alice", "select 5", password="alice-secret")
            self.assertEqual((r.returncode, r.stdout), (0, b"5\n"), r)
        finally:
            for s in held:
                s.close()


if __name__ == "__main__":
    unittest.main()
