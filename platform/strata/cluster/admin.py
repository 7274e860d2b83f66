from django.contrib import admin

from strata.cluster.models import Device, DevicePool, Node


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "address", "last_heartbeat", "lease_expires_at"]
    inlines = [DeviceInline]


@admin.register(DevicePool)
class DevicePoolAdmin(admin.ModelAdmin):
    list_display = ["name", "sharing_policy", "updated_at"]
