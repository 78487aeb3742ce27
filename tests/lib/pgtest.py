"""pgtest.py -- a real PostgreSQL 15 for tests, the database proxy harness, libpq and the wire protocol.

PostgresServer: Debian's postgresql-15 (/usr/lib/postgresql/15/bin) run as the unprivileged
`postgres` user (else nobody) in a temp dir of its own under /var/tmp, on a free loopback port,
with scram-sha-256 for every connection; it holds a role and database NAME (password PASSWORD).
stop() stops it and removes the dir, and runs at exit too (even when a test failed).

ProxyHarness: build/tests/lib/pg_harness, the proxy of api/pg in a process of its own routing
NAME to that server (see its header).

Libpq: the machine's libpq.so.5 through ctypes (a real client, as psycopg would use it).
Wire helpers: raw startup packets and ErrorResponse parsing for the bad-input tests.
"""

import atexit
import ctypes
import os
import pwd
import shutil
import socket
import struct
import subprocess
import tempfile
import time

PG_BIN = "/usr/lib/postgresql/15/bin"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.path.join(REPO, os.environ.get("MOAT_BUILD", "build")))

_live = []


def _stop_all():
    for x in list(_live):
        try:
            x.stop()
        except Exception:
            pass


atexit.register(_stop_all)


def available():
    """None when PostgreSQL 15 can be run here, else why not."""
    for b in ("initdb", "postgres"):
        if not os.access(os.path.join(PG_BIN, b), os.X_OK):
            return "%s/%s is missing (apt-get install postgresql-15)" % (PG_BIN, b)
    if os.geteuid() != 0:
        return "needs root (to run PostgreSQL as an unprivileged user)"
    return None


def free_port(host="127.0.0.1"):
    s = socket.socket()
    s.bind((host, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _user():
    for n in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(n)
        except KeyError:
            pass
    raise RuntimeError("no unprivileged user to run PostgreSQL as")


class PostgresServer:
    def __init__(self, name="alice", password="alice-secret", max_connections=300):
        self.name, self.password = name, password
        self.superpw = "super-" + os.urandom(6).hex()
        self.max_connections = max_connections
        self.port = None
        self.dir = None
        self.proc = None

    def _as_user(self):
        u = self.user

        def f():
            os.setgid(u.pw_gid)
            os.setgroups([])
            os.setuid(u.pw_uid)
        return f

    def start(self):
        self.user = _user()
        self.dir = tempfile.mkdtemp(prefix="moat-pg-", dir="/var/tmp")
        _live.append(self)
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        data = os.path.join(self.dir, "data")
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as f:
            f.write(self.superpw + "\n")
        os.chown(pwfile, self.user.pw_uid, self.user.pw_gid)
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": self.dir}
        r = subprocess.run([os.path.join(PG_BIN, "initdb"), "-D", data, "-U", "postgres", "--auth=scram-sha-256",
                            "--pwfile", pwfile, "-E", "UTF8", "--no-sync"],
                           preexec_fn=self._as_user(), env=env, cwd=self.dir, capture_output=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("initdb: %s" % (r.stdout + r.stderr).decode(errors="replace"))
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "postgres.log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(PG_BIN, "postgres"), "-D", data, "-p", str(self.port), "-k", self.dir,
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=%d" % self.max_connections,
             "-c", "fsync=off", "-c", "shared_buffers=32MB"],
            preexec_fn=self._as_user(), env=env, cwd=self.dir, stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited: %s" % self.log_tail())
            r = subprocess.run([os.path.join(PG_BIN, "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                               capture_output=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                raise RuntimeError("postgres not ready: %s" % self.log_tail())
            time.sleep(0.1)
        self.psql_super("CREATE ROLE %s LOGIN PASSWORD '%s'" % (self.name, self.password))
        self.psql_super("CREATE DATABASE %s OWNER %s" % (self.name, self.name))
        return self

    def log_tail(self, n=4000):
        try:
            with open(os.path.join(self.dir, "postgres.log"), "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def psql_super(self, sql):
        r = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
                            "-U", "postgres", "-d", "postgres", "-Atc", sql],
                           env=dict(os.environ, PGPASSWORD=self.superpw, PGSSLMODE="disable"),
                           capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("psql %r: %s" % (sql, r.stderr.decode(errors="replace")))
        return r.stdout.decode()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown; then fast, then kill
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()
            self.log = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self in _live:
            _live.remove(self)


class ProxyHarness:
    def __init__(self, backend_port, name, *args):
        self.argv = [os.path.join(BUILD, "tests", "lib", "pg_harness"), "--backend", "127.0.0.1:%d" % backend_port,
                     "--name", name] + list(args)
        self.proc = None
        self.port = None

    def start(self):
        self.errlog = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog)
        _live.append(self)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("pg proxy on port "):
            raise RuntimeError("pg_harness did not start: %r %s" % (line, self.log()))
        self.port = int(line.split()[-1])
        self.scoped_port = None
        if "--scoped-listen" in self.argv:
            line = self.proc.stdout.readline().decode()
            if not line.startswith("scoped on port "):
                raise RuntimeError("pg_harness: no scoped listener: %r %s" % (line, self.log()))
            self.scoped_port = int(line.split()[-1])
        return self

    def log(self):
        self.errlog.seek(0)
        return self.errlog.read().decode(errors="replace")

    def stats(self):
        self.proc.stdin.write(b"stats\n")
        self.proc.stdin.flush()
        w = self.proc.stdout.readline().decode().split()
        # active N routed N events +N -N
        return {"active": int(w[1]), "routed": int(w[3]), "plus": int(w[5]), "minus": -int(w[6])}

    def wait_idle(self, timeout=30):
        deadline = time.time() + timeout
        while True:
            s = self.stats()
            if s["active"] == 0 and s["routed"] == 0:
                return s
            if time.time() > deadline:
                return s
            time.sleep(0.05)

    def stop(self):
        """Closes stdin (the harness stops its proxy) and returns its exit status; raises when a
        sanitizer reported anything (an ASan build: MOAT_BUILD=build/san)."""
        rc = None
        if self.proc:
            try:
                self.proc.stdin.close()
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self in _live:
            _live.remove(self)
        log = self.log()
        if "ERROR: AddressSanitizer" in log or "runtime error:" in log or "LeakSanitizer" in log:
            raise RuntimeError("pg_harness: sanitizer report:\n" + log[-4000:])
        return rc


# ---- libpq through ctypes ----

CONNECTION_OK = 0
PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_FATAL_ERROR = 1, 2, 7


class Libpq:
    def __init__(self):
        lib = ctypes.CDLL("libpq.so.5")
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        for fn, res, args in [
            ("PQconnectdb", vp, [cp]), ("PQstatus", ctypes.c_int, [vp]), ("PQerrorMessage", cp, [vp]),
            ("PQfinish", None, [vp]), ("PQexec", vp, [vp, cp]), ("PQresultStatus", ctypes.c_int, [vp]),
            ("PQresultErrorMessage", cp, [vp]), ("PQresultErrorField", cp, [vp, ctypes.c_int]),
            ("PQgetvalue", cp, [vp, ctypes.c_int, ctypes.c_int]), ("PQntuples", ctypes.c_int, [vp]),
            ("PQclear", None, [vp]), ("PQgetCancel", vp, [vp]), ("PQfreeCancel", None, [vp]),
            ("PQcancel", ctypes.c_int, [vp, cp, ctypes.c_int]), ("PQbackendPID", ctypes.c_int, [vp]),
        ]:
            f = getattr(lib, fn)
            f.restype, f.argtypes = res, args
        self.lib = lib

    def connect(self, conninfo):
        return PGConn(self, conninfo)


class PGError(Exception):
    def __init__(self, msg, sqlstate=None):
        super().__init__(msg)
        self.sqlstate = sqlstate


class PGConn:
    def __init__(self, pq, conninfo):
        self.pq, self.lib = pq, pq.lib
        self.c = self.lib.PQconnectdb(conninfo.encode())
        if self.lib.PQstatus(self.c) != CONNECTION_OK:
            msg = self.lib.PQerrorMessage(self.c).decode(errors="replace")
            self.lib.PQfinish(self.c)
            self.c = None
            raise PGError(msg)

    def query(self, sql):
        """Rows (lists of strings) of sql, or raises PGError with its SQLSTATE."""
        r = self.lib.PQexec(self.c, sql.encode())
        try:
            st = self.lib.PQresultStatus(r)
            if st == PGRES_TUPLES_OK:
                n = self.lib.PQntuples(r)
                return [[self.lib.PQgetvalue(r, i, 0).decode()] for i in range(n)]
            if st == PGRES_COMMAND_OK:
                return []
            code = self.lib.PQresultErrorField(r, ord("C"))
            raise PGError(self.lib.PQresultErrorMessage(r).decode(errors="replace"), code.decode() if code else None)
        finally:
            self.lib.PQclear(r)

    def cancel(self):
        """PQcancel from this thread (another runs the query): True when libpq sent it."""
        cn = self.lib.PQgetCancel(self.c)
        buf = ctypes.create_string_buffer(256)
        ok = self.lib.PQcancel(cn, buf, 256)
        self.lib.PQfreeCancel(cn)
        return bool(ok)

    def backend_pid(self):
        return self.lib.PQbackendPID(self.c)

    def close(self):
        if self.c:
            self.lib.PQfinish(self.c)
            self.c = None


# ---- the wire ----

def startup_packet(params, version=196608):
    body = struct.pack("!I", version)
    for k, v in params.items():
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def read_error(sock, timeout=10):
    """Reads until the server closes; returns ({field: value}, everything read) of the first
    ErrorResponse, or (None, data)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            b = sock.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        data += b
    if len(data) >= 5 and data[:1] == b"E":
        n = struct.unpack("!I", data[1:5])[0]
        fields = {}
        for part in data[5:1 + n].split(b"\0"):
            if part:
                fields[chr(part[0])] = part[1:].decode(errors="replace")
        return fields, data
    return None, data
