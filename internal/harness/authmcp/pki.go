package authmcp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is a CA generated for one server, the server's certificate and, for mTLS, a client
// certificate; the PEM files are in a directory of the caller.
type pki struct {
	ca                                    *x509.Certificate
	server                                tls.Certificate
	caFile, clientCertFile, clientKeyFile string
}

// newPKI generates the CA and certificates and writes ca.pem (and client.pem, client-key.pem
// with mode 0600 when client is set) into dir.
func newPKI(dir string, client bool) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("authmcp: CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "authmcp test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("authmcp: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("authmcp: CA certificate: %w", err)
	}
	p := &pki{ca: ca, caFile: filepath.Join(dir, "ca.pem")}
	if err := writePEM(p.caFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) ([]byte, *ecdsa.PrivateKey, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, fmt.Errorf("authmcp: %s key: %w", cn, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips, DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, fmt.Errorf("authmcp: %s certificate: %w", cn, err)
		}
		return der, key, nil
	}
	serverDER, serverKey, err := issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	p.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}
	if !client {
		return p, nil
	}
	clientDER, clientKey, err := issue(3, "mcpsync test client", x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	if err != nil {
		return nil, fmt.Errorf("authmcp: client key: %w", err)
	}
	p.clientCertFile, p.clientKeyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := writePEM(p.clientCertFile, "CERTIFICATE", clientDER, 0o644); err != nil {
		return nil, err
	}
	if err := writePEM(p.clientKeyFile, "PRIVATE KEY", keyDER, 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("authmcp: %w", err)
	}
	return nil
}
