from rest_framework.throttling import UserRateThrottle


class SubmitThrottle(UserRateThrottle):
    scope = "submit"
