"""fakenet_servers.py -- the servers of a test's fake internet, run INSIDE its network namespace
(ip netns exec NAME python3 fakenet_servers.py CONFIG_JSON) by fakenet.py.

CONFIG: {"dns": "IP", "zone": {"name": ["IP", ...]}, "ttl": N, "http": ["IP", ...], "tcp": [[IP, PORT], ...],
         "sink": [IP, PORT]}
- dns: a DNS server on IP:53 (UDP and TCP) answering A queries from zone (NXDOMAIN otherwise); every query is
  appended to a list the "dnslog" HTTP path returns. Names under blackhole.test are never answered (a dead
  authoritative server: the resolver's query stays pending until it times out).
- http: HTTP/1.0 servers on IP:80 answering "hello from IP" (the address the client reached).
- tcp: plain TCP listeners answering "open IP PORT\n" and closing (a "mining pool" port...).
- sink: TCP server that reads everything and answers with the byte count (throughput), or echoes one
  byte per byte received for connect-latency probes when the client sends "ping".
Prints "ready" once everything listens. Standard library only.
"""
import json
import socket
import socketserver
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

cfg = json.loads(sys.argv[1])
zone = {k.lower().rstrip("."): v for k, v in cfg.get("zone", {}).items()}
ttl = int(cfg.get("ttl", 300))
queries = []


def dns_answer(q):
    if len(q) < 12:
        return None
    qid, flags, qd = struct.unpack("!HHH", q[:6])
    off, labels = 12, []
    while off < len(q) and q[off] != 0:
        n = q[off]
        labels.append(q[off + 1:off + 1 + n].decode(errors="replace"))
        off += 1 + n
    off += 1
    qtype, qclass = struct.unpack("!HH", q[off:off + 4])
    qend = off + 4
    name = ".".join(labels).lower()
    queries.append(name)
    if name == "blackhole.test" or name.endswith(".blackhole.test"):
        return None
    addrs = zone.get(name)
    rcode = 0 if addrs is not None else 3
    answers = b""
    n = 0
    if addrs and qtype == 1:
        for a in addrs:
            answers += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, ttl, 4) + socket.inet_aton(a)
            n += 1
    hdr = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, n, 0, 0)
    return hdr + q[12:qend] + answers


def dns_main(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(4096)
        r = dns_answer(q)
        if r:
            s.sendto(r, peer)


class DnsTcp(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            hdr = self.request.recv(2)
            if len(hdr) < 2:
                return
            n = struct.unpack("!H", hdr)[0]
            q = b""
            while len(q) < n:
                d = self.request.recv(n - len(q))
                if not d:
                    return
                q += d
            r = dns_answer(q)
            if r:
                self.request.sendall(struct.pack("!H", len(r)) + r)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/dnslog":
            body = json.dumps(queries).encode()
        else:
            body = ("hello from %s\n" % self.server.server_address[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class Open(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(("open %s %d\n" % self.server.server_address).encode())


class Sink(socketserver.BaseRequestHandler):
    def handle(self):
        first = self.request.recv(65536)
        if first.startswith(b"ping"):
            self.request.sendall(b"p")
            while True:
                d = self.request.recv(64)
                if not d:
                    return
                self.request.sendall(b"p" * len(d))
        total = len(first)
        while True:
            d = self.request.recv(1 << 20)
            if not d:
                break
            total += len(d)
        try:
            self.request.sendall(str(total).encode())
        except OSError:
            pass


class TS(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 drops SYNs under a dozen concurrent connects


class HTTPS(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


threads = []
if cfg.get("dns"):
    threads.append(threading.Thread(target=dns_main, args=(cfg["dns"],), daemon=True))
    tsrv = None  # bound below, after the class TS exists
if cfg.get("dns"):
    tsrv = TS((cfg["dns"], 53), DnsTcp)
    threads.append(threading.Thread(target=tsrv.serve_forever, daemon=True))
for ip in cfg.get("http", []):
    srv = HTTPS((ip, 80), Handler)
    threads.append(threading.Thread(target=srv.serve_forever, daemon=True))
for ip, port in cfg.get("tcp", []):
    srv = TS((ip, port), Open)
    threads.append(threading.Thread(target=srv.serve_forever, daemon=True))
if cfg.get("sink"):
    srv = TS(tuple(cfg["sink"]), Sink)
    threads.append(threading.Thread(target=srv.serve_forever, daemon=True))
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.read()  # runs until the parent closes our stdin or kills us
