from django.contrib import admin

from strata.notify.models import Delivery, EmailSubscription, Webhook


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["id", "team", "url", "format", "enabled", "created_by", "created_at"]
    list_filter = ["format", "enabled"]
    exclude = ["secret_ciphertext"]  # the signing secret is shown once, at creation (API, CLI, dashboard)
    readonly_fields = ["created_at"]

    def has_add_permission(self, request):
        return False  # created through the API, the CLI or the Notifications page, which make its secret


@admin.register(EmailSubscription)
class EmailSubscriptionAdmin(admin.ModelAdmin):
    list_display = ["address", "team", "enabled", "created_at"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "team", "event", "webhook", "email", "status", "attempts", "response_code", "created_at"]
    list_filter = ["status", "event"]
    readonly_fields = [field.name for field in Delivery._meta.fields]
