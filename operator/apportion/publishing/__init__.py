"""Everything the operator writes to the API server besides kopf's own bookkeeping: ConfigMaps
(owned by their resource, written with optimistic concurrency), status patches, Events and
pod-deletion-cost annotations. One lightkube client per process (`client.api()`)."""
