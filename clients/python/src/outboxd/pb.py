"""The generated protobuf messages and gRPC stubs of `proto/outbox/v1`, for what the typed
helpers do not cover (`pb.admin.Consumer`, `pb.outbox.SubscribeRequest`, ...)."""

from outboxd._proto.outbox.v1 import admin_pb2 as admin
from outboxd._proto.outbox.v1 import admin_pb2_grpc as admin_grpc
from outboxd._proto.outbox.v1 import outbox_pb2 as outbox
from outboxd._proto.outbox.v1 import outbox_pb2_grpc as outbox_grpc

__all__ = ["admin", "admin_grpc", "outbox", "outbox_grpc"]
