"""OAUTHBEARER for kmirror's tests: tokens the harness makes itself, and what a broker needs to
validate them.

    unsecured = Issuer()                       # unsigned tokens (alg none): Kafka's default validator
    signed = Issuer(signed=True).start()       # RS256 tokens; a JWKS on a free loopback port
    KafkaCluster("src", oauth=unsecured)       # the SASL listener offers OAUTHBEARER too
    signed.write_token(path, "kmirrord", lifetime=60)
    signed.stop()

A started issuer serves a client-credentials token endpoint (POST /token, KIP-768:
grant_type=client_credentials with HTTP Basic client id and secret, the registered clients in
`clients`) and, when signed, its RSA key's JWKS (GET /jwks) from one HTTP server thread; brokers
validate signed tokens with
Kafka's OAuthBearerValidatorCallbackHandler, fetching the JWKS (the URL allowed by the JVM
property org.apache.kafka.sasl.oauthbearer.allowed.urls, in `java_opts`).
"""

import base64
import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .kafka_cluster import free_port

LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"


def b64url(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(n):
    return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


class Issuer:
    """Makes tokens for subjects; signed=True: RS256 with a key of its own, served as a JWKS."""

    AUDIENCE = "kafka"
    ISSUER = "https://kmirror-tests.invalid/issuer"

    def __init__(self, signed=False):
        self.signed = signed
        self.kid = f"kmirror-test-{os.getpid()}-{id(self) & 0xffff:x}"
        self.port = None
        self._server = None
        self._thread = None
        # client id -> (secret, subject, token lifetime s): the token endpoint's registered clients.
        self.clients = {}
        self.token_requests = []  # (client id, scope) of each answered token request
        if signed:
            from cryptography.hazmat.primitives.asymmetric import rsa
            self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    # -- tokens ---------------------------------------------------------------------------------

    def token(self, sub, lifetime=3600, exp=None, iat=None, scope=None, audience=None):
        now = int(time.time())
        claims = {"sub": sub, "iat": now if iat is None else iat,
                  "exp": now + lifetime if exp is None else exp}
        if scope is not None:
            claims["scope"] = scope
        if not self.signed:
            return f"{b64url(json.dumps({'alg': 'none'}))}.{b64url(json.dumps(claims))}."
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        claims.update(iss=self.ISSUER, aud=audience or self.AUDIENCE)
        head = b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": self.kid}))
        body = b64url(json.dumps(claims))
        sig = self._key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{head}.{body}.{b64url(sig)}"

    def write_token(self, path, sub, **kw):
        """A token for sub into path (mode 600), replaced atomically as a token agent would."""
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token(sub, **kw) + "\n")
        os.replace(tmp, path)
        return str(path)

    def jwks(self):
        pub = self._key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid,
                          "n": _uint(pub.n), "e": _uint(pub.e)}]}

    # -- the HTTP server (signed only) ---------------------------------------------------------

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def jwks_url(self):
        return f"{self.base_url}/jwks"

    @property
    def token_url(self):
        return f"{self.base_url}/token"

    def start(self):
        if self._server:
            return self
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, code, doc):
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/jwks" and issuer.signed:
                    self._answer(200, issuer.jwks())
                else:
                    self._answer(404, {"error": "not_found"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(n).decode())
                auth = self.headers.get("Authorization", "")
                cid = secret = None
                if auth.startswith("Basic "):
                    try:
                        cid, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                        cid, secret = urllib.parse.unquote(cid), urllib.parse.unquote(secret)
                    except ValueError:
                        pass
                if self.path != "/token" or form.get("grant_type") != ["client_credentials"]:
                    self._answer(400, {"error": "unsupported_grant_type"})
                    return
                client = issuer.clients.get(cid)
                if not client or client[0] != secret:
                    self._answer(401, {"error": "invalid_client", "error_description": "bad client id or secret"})
                    return
                scope = (form.get("scope") or [None])[0]
                issuer.token_requests.append((cid, scope))
                life = client[2]
                self._answer(200, {"access_token": issuer.token(client[1], lifetime=life, scope=scope),
                                   "token_type": "Bearer", "expires_in": life})

        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="oauth-issuer", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- brokers --------------------------------------------------------------------------------

    @property
    def java_opts(self):
        """Kafka 4 fetches only the URLs this JVM property allows."""
        return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={self.jwks_url},{self.token_url}"] \
            if self.signed else []

    def broker_properties(self, listener="sasl"):
        """The SASL listener's OAUTHBEARER: Kafka's unsecured validator (unsigned tokens), or the
        JWKS validator with this issuer's audience and issuer expected. The broker's own login
        (it makes no OAUTHBEARER connections) is the unsecured one."""
        p = {f"listener.name.{listener}.oauthbearer.sasl.jaas.config":
             f'{LOGIN_MODULE} required unsecuredLoginStringClaim_sub="admin";'}
        if self.signed:
            p.update({
                f"listener.name.{listener}.oauthbearer.sasl.server.callback.handler.class": VALIDATOR,
                "sasl.oauthbearer.jwks.endpoint.url": self.jwks_url,
                "sasl.oauthbearer.expected.audience": self.AUDIENCE,
                "sasl.oauthbearer.expected.issuer": self.ISSUER,
            })
        return p
