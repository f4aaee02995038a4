"""The GrainType controller's parts: the placement table built from pods and their load
(`document`), when it is written (`gate`), and the per-GrainType loop that does both (`loop`).
`apportion.controllers.graintypes.handlers` holds the kopf handlers."""
