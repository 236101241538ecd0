"""Errors of the development cluster, written for the person running it."""

from __future__ import annotations


class DevclusterError(Exception):
    """Something the person running devcluster can fix; the message says what and how."""

    user_facing = True
