import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "strata.settings")
_django = get_wsgi_application()

from strata.api.fastpath import NodeFastPath  # noqa: E402 - after Django is set up

# The node's lease renewal skips Django's middleware (strata.api.fastpath); everything else is Django's.
application = NodeFastPath(_django)
