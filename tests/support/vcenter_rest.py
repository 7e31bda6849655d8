#!/usr/bin/python3
"""A small vCenter REST server (the /rest API fence_vmware_rest speaks), for tests only.

Plain HTTP on 127.0.0.1, a free port printed as the first line of stdout. The VMs are read
from the JSON file given as the first argument on every request ([{"vm", "name",
"power_state"}]), so a test changes a VM's state by rewriting the file. Basic auth admin /
password opens a session; every other call needs its id in vmware-api-session-id.
"""

import base64
import json
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VMS_FILE = sys.argv[1]
USER, PASSWORD = "admin", "password"
SESSION = "session-1f2e3d"


def vms():
    with open(VMS_FILE, encoding="utf-8") as f:
        return json.load(f)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.command, self.path))

    def answer(self, code, value):
        body = json.dumps({"value": value}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def refuse(self, code, message):
        self.answer(code, {"messages": [{"default_message": message}]})

    def route(self):
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if not path.startswith("/rest/"):
            return self.refuse(404, "not found: " + path)
        path = path[len("/rest/"):]
        if path == "com/vmware/cis/session" and self.command == "POST":
            expected = base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode()
            if self.headers.get("Authorization") != "Basic " + expected:
                return self.refuse(401, "Authentication required.")
            return self.answer(200, SESSION)
        if self.headers.get("vmware-api-session-id") != SESSION:
            return self.refuse(401, "Authentication required.")
        if path == "com/vmware/cis/session" and self.command == "DELETE":
            return self.answer(200, None)
        if path == "vcenter/vm" and self.command == "GET":
            query = urllib.parse.parse_qs(url.query)
            names = query.get("filter.names")
            listed = [v for v in vms() if names is None or v["name"] in names]
            return self.answer(200, listed)
        return self.refuse(404, "no such operation: %s %s" % (self.command, path))

    def do_GET(self):
        self.route()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.route()

    def do_DELETE(self):
        self.route()


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
