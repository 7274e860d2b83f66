from django.contrib import admin

from strata.quotas.models import Quota


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["team", "max_gpus", "max_gpu_memory", "max_cpus", "max_memory", "max_concurrent_jobs", "gpu_hours", "window_hours",
                    "priority", "weight"]
