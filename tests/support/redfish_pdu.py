# A Redfish rack PDU for tests only (Python's standard library), run after HTTPS_SERVER_PY
# (tests/support/mod.rs), which gives tls_context() and https_server(): HTTPS on 127.0.0.1, a
# free port printed as the first line of stdout.
#
# Arguments: CERT KEY DATA_DIR STATE_FILE. DATA_DIR holds DMTF's rack PDU examples
# (tests/data/redfish-pdu); STATE_FILE is JSON read on every request, rewritten by the test:
#   {"outlets": {"A1": {"PowerState": "On", "PowerWatts": 197.4}, ...},
#    "targets": {"A3": "/redfish/v1/...", ...}, "aliases": {"Z9": "/redfish/v1/...", ...}}
# An outlet's PowerWatts null or missing serves the outlet without PowerWatts; "targets" gives
# an outlet's #Outlet.PowerControl target where a test wants another one than its own;
# "aliases" answers a GET of outlet Z9 with another resource of the PDU, as it is.
#
# HTTP Basic admin / password on everything but the service root. GET of
# /redfish/v1/PowerEquipment, .../RackPDUs/1 and .../RackPDUs/1/Outlets/{id} for the outlets the
# state lists; POST of {"PowerState": "On"|"Off"} to an outlet's Outlet.PowerControl sets its
# state (Off reads 0 W after it, On 150 W) and answers 204. Everything else is 404. Every
# request is written to stderr as "METHOD PATH".

import base64
import copy
import http.server
import json
import os
import sys
import threading

DATA_DIR, STATE_FILE = sys.argv[3], sys.argv[4]
USER, PASSWORD = "admin", "password"
PDU = "/redfish/v1/PowerEquipment/RackPDUs/1"
LOCK = threading.Lock()


def example(name):
    with open(os.path.join(DATA_DIR, name), encoding="utf-8") as f:
        return json.load(f)


OUTLET = example("Outlet-v1-example.json")
RESOURCES = {
    "/redfish/v1/PowerEquipment": example("PowerEquipment-v1-example.json"),
    PDU: example("PowerDistribution-v1-example.json"),
}
ROOT = {
    "@odata.id": "/redfish/v1/",
    "@odata.type": "#ServiceRoot.v1_18_0.ServiceRoot",
    "Id": "RootService",
    "Name": "Root Service",
    "RedfishVersion": "1.15.0",
    "PowerEquipment": {"@odata.id": "/redfish/v1/PowerEquipment"},
}


def state():
    with open(STATE_FILE, encoding="utf-8") as f:
        return json.load(f)


def write_state(doc):
    tmp = STATE_FILE + ".server"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, STATE_FILE)


def outlet(oid, st):
    seen = st["outlets"][oid]
    doc = copy.deepcopy(OUTLET)
    path = "%s/Outlets/%s" % (PDU, oid)
    doc["@odata.id"] = path
    doc["Id"] = oid
    doc["Name"] = "Outlet %s" % oid
    doc["PowerState"] = seen["PowerState"]
    if seen.get("PowerWatts") is None:
        del doc["PowerWatts"]
    else:
        doc["PowerWatts"]["Reading"] = seen["PowerWatts"]
    for name, action in doc["Actions"].items():
        action["target"] = "%s/%s" % (path, name.lstrip("#"))
    target = st.get("targets", {}).get(oid)
    if target is not None:
        doc["Actions"]["#Outlet.PowerControl"]["target"] = target
    return doc


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.command, self.path))
        sys.stderr.flush()

    def reply(self, code, doc=None, headers=()):
        body = b"" if doc is None else json.dumps(doc).encode()
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        if doc is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, code, message_id, message):
        headers = [("WWW-Authenticate", 'Basic realm="PDU"')] if code == 401 else []
        self.reply(code, {"error": {"code": message_id, "message": message}}, headers)

    def authorized(self):
        expected = base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode()
        return self.headers.get("Authorization") == "Basic " + expected

    def route(self, body):
        path = self.path
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]
        if path == "/redfish/v1" and self.command == "GET":
            return self.reply(200, ROOT)
        if not self.authorized():
            return self.error(401, "Base.1.8.GeneralError", "Authentication required.")
        with LOCK:
            st = state()
            if self.command == "GET" and path in RESOURCES:
                return self.reply(200, RESOURCES[path])
            prefix = PDU + "/Outlets/"
            alias = st.get("aliases", {}).get(path[len(prefix):])
            if self.command == "GET" and path.startswith(prefix) and alias in RESOURCES:
                return self.reply(200, RESOURCES[alias])
            if path.startswith(prefix):
                rest = path[len(prefix):].split("/")
                oid = rest[0]
                if oid in st["outlets"]:
                    if self.command == "GET" and len(rest) == 1:
                        return self.reply(200, outlet(oid, st))
                    if self.command == "POST" and rest[1:] == ["Outlet.PowerControl"]:
                        return self.power_control(st, oid, body)
        self.error(404, "Base.1.8.ResourceMissingAtURI", "No resource at %s." % self.path)

    def power_control(self, st, oid, body):
        try:
            wanted = json.loads(body)["PowerState"]
        except (ValueError, KeyError, TypeError):
            wanted = None
        if wanted not in ("On", "Off"):
            return self.error(400, "Base.1.8.ActionParameterValueNotInList",
                              "PowerState must be On or Off.")
        st["outlets"][oid] = {"PowerState": wanted, "PowerWatts": 150.0 if wanted == "On" else 0.0}
        write_state(st)
        self.reply(204)

    def do_GET(self):
        self.route(b"")

    def do_POST(self):
        self.route(self.rfile.read(int(self.headers.get("Content-Length") or 0)))


server = https_server(Handler, tls_context())
server.serve_forever()
