"""Ray's ``ray.tune.utils`` path: helpers that Ray Tune's example scripts import."""
