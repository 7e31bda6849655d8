# snmpsim variation module for tests/support/snmp_pdu.rs: an outlet whose state is a file.
#
# A record `OID|2:outlet|PATH` answers GET and GETNEXT with the integer in PATH and a SET by
# writing the value set into PATH (then answering it), so the test and the agent share one
# outlet: the test changes it between reads by rewriting the file, the agent's SET on the
# outlet's control OID changes what its status OID reads.
import os

from snmpsim.grammar.snmprec import SnmprecGrammar
from snmpsim.record.snmprec import SnmprecRecord


def init(**context):
    pass


def variate(oid, tag, value, **context):
    if not context["nextFlag"] and not context["exactMatch"]:
        return context["origOid"], tag, context["errorStatus"]
    syntax = SnmprecGrammar.TAG_MAP[SnmprecRecord.unpack_tag(tag)[0]]
    if context["setFlag"]:
        tmp = value + ".set"
        with open(tmp, "w") as f:
            f.write("%d\n" % int(context["origValue"]))
        os.replace(tmp, value)
    with open(value) as f:
        return oid, tag, syntax().clone(int(f.read().strip()))


def shutdown(**context):
    pass
