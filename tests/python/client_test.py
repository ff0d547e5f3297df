"""A producer and consumer in Python, using only what other languages get: the SQL function
`outbox.enqueue` inside the producer's own transaction, and gRPC code generated from proto/,
over TLS with a bearer token when OUTBOXD_TLS_CA and OUTBOXD_TOKEN are set.

Exits non-zero on any failed expectation; prints PYTHON CLIENT OK at the end.
"""
import os
import queue
import sys
import tempfile
import threading

import grpc
import psycopg
from grpc_tools import protoc

ADDR = os.environ["OUTBOXD_ADDR"]
DB = os.environ["DATABASE_URL"]
PROTO = os.environ["PROTO_DIR"]
# TLS (the CA that outboxd's certificate chains to) and a bearer token, when outboxd has them.
TLS_CA = os.environ.get("OUTBOXD_TLS_CA")
TOKEN = os.environ.get("OUTBOXD_TOKEN")

out = tempfile.mkdtemp()
rc = protoc.main(["protoc", f"-I{PROTO}", f"-I{os.path.dirname(protoc.__file__)}/_proto",
                  f"--python_out={out}", f"--grpc_python_out={out}",
                  "outbox/v1/outbox.proto", "outbox/v1/admin.proto"])
assert rc == 0, "protoc failed"
sys.path.insert(0, out)
from outbox.v1 import admin_pb2, admin_pb2_grpc, outbox_pb2, outbox_pb2_grpc  # noqa: E402


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)


# Produce: the order row and its event commit together; a rolled-back one leaves nothing.
with psycopg.connect(DB) as conn:
    with conn.transaction():
        conn.execute("CREATE TABLE py_orders (id int PRIMARY KEY)")
        conn.execute("INSERT INTO py_orders VALUES (1)")
        first = conn.execute(
            "SELECT outbox.enqueue(%s, %s, %s, %s::jsonb)",
            ("orders.created", "OrderCreated", b'{"id":1}', '{"source":"python"}'),
        ).fetchone()[0]
        dup = conn.execute(
            "SELECT outbox.enqueue(%s, %s, %s, '{}'::jsonb, %s)",
            ("orders.created", "OrderCreated", b'{"id":1}', first),
        ).fetchone()[0]
        check(dup == first, "duplicate enqueue returns the same id")
    try:
        with conn.transaction():
            conn.execute("SELECT outbox.enqueue('orders.created', 'Never', '\\x00'::bytea)")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    with conn.transaction():
        second = conn.execute(
            "SELECT outbox.enqueue('orders.shipped', 'OrderShipped', '\\x7b7d'::bytea)"
        ).fetchone()[0]

def open_channel(token):
    if not TLS_CA:
        return grpc.insecure_channel(ADDR)
    with open(TLS_CA, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    if token:
        # Sent as "authorization: Bearer <token>" on every call.
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(ADDR, creds)


channel = open_channel(TOKEN)
admin = admin_pb2_grpc.OutboxAdminStub(channel)
stub = outbox_pb2_grpc.OutboxStub(channel)

requests = queue.Queue()
requests.put(outbox_pb2.SubscribeRequest(start=outbox_pb2.Start(consumer="py", max_in_flight=10)))


def request_iter():
    while True:
        r = requests.get()
        if r is None:
            return
        yield r


responses = stub.Subscribe(request_iter())
deliveries = []
done = threading.Event()


def next_delivery():
    resp = next(responses)
    check(resp.WhichOneof("response") == "delivery", "a delivery")
    return resp.delivery


d1 = next_delivery()
d2 = next_delivery()
check({d1.message_id, d2.message_id} == {str(first), str(second)}, "both committed messages, nothing else")
check(d1.delivery_count == 1 and d2.delivery_count == 1, "first deliveries count 1")
first_d = d1 if d1.message_id == str(first) else d2
check(first_d.headers["source"] == "python", "headers carried")
check(first_d.type == "OrderCreated" and first_d.payload == b'{"id":1}', "type and payload carried")

# Nack the first: it comes back with delivery_count 2; ack everything.
requests.put(outbox_pb2.SubscribeRequest(nack=outbox_pb2.Nack(message_id=str(first), error="python says no")))
other = d2 if first_d is d1 else d1
requests.put(outbox_pb2.SubscribeRequest(ack=outbox_pb2.Ack(message_ids=[other.message_id])))
again = next_delivery()
check(again.message_id == str(first) and again.delivery_count == 2, "nacked message redelivered with count 2")
requests.put(outbox_pb2.SubscribeRequest(ack=outbox_pb2.Ack(message_ids=[again.message_id])))

import time  # noqa: E402

deadline = time.time() + 15
while True:
    stats = admin.GetStats(admin_pb2.GetStatsRequest(consumer="py"))
    c = stats.consumers[0]
    if c.acked == 2 and c.backlog == 0 and c.in_flight == 0:
        break
    check(time.time() < deadline, f"acks applied (stats: {c})")
    time.sleep(0.05)

msg = admin.GetMessage(admin_pb2.GetMessageRequest(message_id=str(first)))
check(msg.deliveries[0].state == admin_pb2.DeliveryState.ACKED, "delivery state ACKED")
check(msg.deliveries[0].delivery_count == 2, "delivery count recorded")

try:
    stub.Enqueue(outbox_pb2.EnqueueRequest(topic="", type="T"))
    check(False, "empty topic rejected")
except grpc.RpcError as e:
    if TOKEN:
        # This token holds no produce: permission at all, so Enqueue is refused from its
        # headers, before the (invalid) body is read.
        check(e.code() == grpc.StatusCode.PERMISSION_DENIED and "produce:PATTERN" in e.details(),
              f"PERMISSION_DENIED names produce: ({e.code()}: {e.details()})")
    else:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "topic" in e.details(), "INVALID_ARGUMENT names topic")

if TOKEN:
    # This principal may consume "py" and read the admin API, nothing else; without the token,
    # nothing at all.
    try:
        stub.Enqueue(outbox_pb2.EnqueueRequest(topic="orders.created", type="T"))
        check(False, "enqueue without produce:orders.created refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.PERMISSION_DENIED and "produce:PATTERN" in e.details(),
              f"PERMISSION_DENIED names the permission ({e.details()})")
    anonymous = open_channel(None)
    try:
        admin_pb2_grpc.OutboxAdminStub(anonymous).ListConsumers(admin_pb2.ListConsumersRequest())
        check(False, "a call without a token refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAUTHENTICATED, f"UNAUTHENTICATED without a token ({e.code()})")
    anonymous.close()

# Close our half of the stream; the server then ends it. Cancel and close explicitly so that
# no gRPC thread outlives the script.
requests.put(None)
responses.cancel()
channel.close()
print("PYTHON CLIENT OK", flush=True)
