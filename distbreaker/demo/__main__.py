"""`python -m distbreaker.demo`: run the fleet demo."""

import sys

from .fleet import main

sys.exit(main())
