"""AdmissionReview v1 handling and the aiohttp webhook server."""
