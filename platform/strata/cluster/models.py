"""Nodes, their devices, node leases and device pools (GPU-sharing policy per pool)."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone


class Node(models.Model):
    class State(models.TextChoices):
        UP = "up"
        DOWN = "down"
        DRAINING = "draining"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    address = models.CharField(max_length=255, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.UP)
    # A new session starts at each registration; attempts dispatched to an older session died with it.
    session = models.UUIDField(default=uuid.uuid4)
    registered_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)
    lease_expires_at = models.DateTimeField(default=timezone.now, db_index=True)
    info = models.JSONField(default=dict, blank=True)
    # The generic report channel: each plugin's latest node report, {plugin: {"time": unix s, "payload": ...,
    # "series_until": unix s}}, checked by the plugin's ReportSchema.node() and split by its parts()
    # (cluster.services.reports_record); series_until is the end of the last series row without a device.
    reports = models.JSONField(default=dict, blank=True)
    # The node's CPUs and host memory (bytes) as its agent reported them at registration, for jobs that need no
    # GPU (``resources.gpus: 0``) and GPU jobs that state ``cpus``/``memory``. Null when not reported (an older
    # agent): the node then takes no job that reserves CPUs. Their reservations are allocations on the node's
    # CPU device (``Device.Kind.CPU``), which the registration creates.
    cpus = models.FloatField(null=True, blank=True)
    memory = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"node.{self.id}"

    @property
    def lease_valid(self) -> bool:
        # A DRAINING node still holds its lease (and runs its attempts); it only takes no new work.
        return self.state in LIVE_STATES and self.lease_expires_at > timezone.now()


# Nodes that hold a lease: UP takes new work, DRAINING only finishes what it runs.
LIVE_STATES = (Node.State.UP, Node.State.DRAINING)


class Device(models.Model):
    """A GPU of a node (CUDA or virtual), or the node's CPU device: one row per node that reported its CPUs
    (``kind == "cpu"``, ``index == CPU_INDEX``, ``memory_total`` its host memory), which the allocations of CPU
    reservations point at, so an attempt that holds no GPU is tied to its node like any other (dispatch, claim,
    heartbeats, reaper, preemption). It is no GPU: listings of devices leave it out (``gpu_devices``)."""

    class Kind(models.TextChoices):
        CUDA = "cuda"
        VIRTUAL = "virtual"
        CPU = "cpu"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=200, blank=True)
    memory_total = models.BigIntegerField()
    utilization = models.FloatField(default=0.0)
    memory_used = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)
    # The generic report channel: each plugin's latest report about this device, {plugin: {"time": unix s,
    # "payload": ..., "series_until": unix s}} (the device's part of the plugin's node report; series_until is
    # the end of the last series row of the device). {} when no plugin reports about it now.
    reports = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="one_device_per_index")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.kind}:{self.index}"

    @property
    def virtual(self) -> bool:
        return self.kind == self.Kind.VIRTUAL

    @property
    def cpu(self) -> bool:
        return self.kind == self.Kind.CPU


# The index of a node's CPU device: out of the way of GPU indexes (which count from 0), within a 32-bit column.
CPU_INDEX = 2**31 - 1


def gpu_devices(queryset=None):
    """``queryset`` of devices (default: all) without the nodes' CPU devices: the GPUs, real or virtual."""
    return (Device.objects.all() if queryset is None else queryset).exclude(kind=Device.Kind.CPU)


DEFAULT_POOL = "default"
POOL_LABEL = "pool"


def node_pool(labels: dict | None) -> str:
    """The device pool of a node with these labels: its ``pool`` label, else ``"default"``."""
    return str((labels or {}).get(POOL_LABEL) or DEFAULT_POOL)


class DevicePool(models.Model):
    """A device pool: the devices of the nodes labelled ``pool=<name>`` (unlabelled nodes: ``default``).

    A row exists only once an admin set something; a pool without one uses the default policy.
    """

    class Policy(models.TextChoices):
        PACK = "pack"
        SRTF = "srtf"
        FAIR = "fair"
        PRIORITY = "priority"

    name = models.SlugField(max_length=200, unique=True)
    sharing_policy = models.CharField(max_length=16, choices=Policy.choices, default=Policy.FAIR)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.sharing_policy})"
