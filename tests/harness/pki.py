"""Test certificates made with the openssl and keytool tools: a CA, certificates it signs, and the
PKCS12 and JKS stores Kafka's Java side and kmirror read."""

import os
import shutil
import subprocess


def available():
    """None when openssl and keytool are on PATH, else why not."""
    missing = [t for t in ("openssl", "keytool") if not shutil.which(t)]
    return f"no {' or '.join(missing)} on PATH" if missing else None


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def keytool(*args, cwd):
    subprocess.run(["keytool", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Pki:
    """A CA in directory d (ca.pem, ca.key) and what it signs there; paths are absolute."""

    def __init__(self, d, name="kmirror test ca"):
        self.dir = str(d)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", f"/CN={name}", cwd=self.dir)
        self.ca = self.path("ca.pem")

    def path(self, name):
        return os.path.join(self.dir, name)

    def issue(self, name, subject, ext):
        """name.pem and name.key: a certificate for subject with the extensions ext (openssl's
        extfile lines), signed by the CA."""
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", subject, cwd=self.dir)
        with open(self.path(f"{name}.ext"), "w") as f:
            f.write(ext)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=self.dir)
        return self.path(f"{name}.pem"), self.path(f"{name}.key")

    def keystore(self, name, subject, ext, password):
        """name.p12: a PKCS12 keystore (openssl pkcs12 -export) with name's key, its certificate
        and the CA's, under password."""
        self.issue(name, subject, ext)
        openssl("pkcs12", "-export", "-in", f"{name}.pem", "-inkey", f"{name}.key", "-certfile", "ca.pem",
                "-name", name, "-out", f"{name}.p12", "-passout", f"pass:{password}", cwd=self.dir)
        return self.path(f"{name}.p12")

    def truststore(self, name, password, kind="PKCS12"):
        """name: keytool's truststore of the CA (a trusted certificate entry, as Java reads one)."""
        keytool("-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", "-keystore", name, "-storetype", kind,
                "-storepass", password, cwd=self.dir)
        return self.path(name)
