// The generated wire types and service descriptors of proto/outbox/v1, in one namespace.
export * from "./gen/outbox/v1/admin_pb.js";
export * from "./gen/outbox/v1/outbox_pb.js";
