"""Ray's ``ray.air`` path: only ``ray.air.integrations``, for translated imports."""
