package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the files of the cluster's keys: a CA, the API server's serving
// certificate (127.0.0.1, localhost, kubernetes.default...), the front-proxy
// client certificate (request-header authentication, which the controller manager
// and scheduler expect to be configured), and the ServiceAccount token signing key
// pair. All ECDSA P-256: fast to generate, supported everywhere.
type pki struct {
	caCert, caKey         string
	servingCert, servingK string
	proxyCert, proxyKey   string
	kubeletCert, kubeletK string // the API server's client certificate towards kubelets
	saKey, saPub          string
	caPEM                 []byte
	ca                    *x509.Certificate
	caSigner              *ecdsa.PrivateKey
}

// writePKI writes the cluster's keys into dir. The serving certificate is valid
// for loopback, the "kubernetes" Service's names and ClusterIP, and extraIPs
// (where a lab node reaches the API server).
func writePKI(dir string, extraIPs []net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{
		caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "apiserver.crt"), servingK: filepath.Join(dir, "apiserver.key"),
		proxyCert: filepath.Join(dir, "front-proxy-client.crt"), proxyKey: filepath.Join(dir, "front-proxy-client.key"),
		kubeletCert: filepath.Join(dir, "apiserver-kubelet-client.crt"), kubeletK: filepath.Join(dir, "apiserver-kubelet-client.key"),
		saKey: filepath.Join(dir, "sa.key"), saPub: filepath.Join(dir, "sa.pub"),
	}
	now := time.Now()

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "amf-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)}, extraIPs...),
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}

	proxyKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	proxyTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: frontProxyName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	proxyDER, err := x509.CreateCertificate(rand.Reader, proxyTmpl, ca, &proxyKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}

	p.ca, p.caSigner = ca, caKey
	// kube-apiserver → kubelet (exec, logs, port-forward): kubelets authorize it as system:masters.
	kubeletCert, kubeletKey, err := p.issueClient("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}

	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for _, f := range []struct {
		path string
		data []byte
	}{
		{p.caCert, p.caPEM},
		{p.caKey, keyPEM(caKey)},
		{p.servingCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER})},
		{p.servingK, keyPEM(srvKey)},
		{p.proxyCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxyDER})},
		{p.proxyKey, keyPEM(proxyKey)},
		{p.kubeletCert, kubeletCert},
		{p.kubeletK, kubeletKey},
		{p.saKey, keyPEM(saKey)},
		{p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})},
	} {
		if f.data == nil {
			return nil, os.ErrInvalid
		}
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// issueClient signs a client certificate for user cn in groups orgs (x509
// authentication: CommonName is the user, Organization the groups).
func (p *pki) issueClient(cn string, orgs ...string) (certPEM, keyPEMBytes []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caSigner)
	if err != nil {
		return nil, nil, err
	}
	kp := keyPEM(k)
	if kp == nil {
		return nil, nil, os.ErrInvalid
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

// frontProxyName is the only client certificate name request-header authentication accepts.
const frontProxyName = "front-proxy-client"

func keyPEM(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n.Add(n, big.NewInt(1))
}

// randomToken returns 32 random hex characters.
func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
