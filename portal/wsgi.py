import os

from django.core.wsgi import get_wsgi_application

from portal.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
settings_or_exit()
application = get_wsgi_application()
