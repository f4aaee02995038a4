"""Everything the operator writes to the API server besides kopf's own bookkeeping: ConfigMaps
(owned by their resource, written with optimistic concurrency), status patches, Events and
pod-deletion-cost annotations. They write through the runtime's one lightkube client
(`client.operator_client()`, field manager `apportion-operator`)."""
