// Writes certificates.json: client certificates signed by one CA that differ from a good one in
// one way each (serial, SAN syntax, size, extensions, ...), and for each what kube-apiserver's
// Go makes of it: whether a TLS server of Go's (as kube-apiserver's, asking for a client
// certificate) completes the handshake, and whether the certificate then verifies as
// kube-apiserver's x509 authenticator verifies it (the CA as root, client auth). Every
// certificate is signed again after its change, so only the change decides. core's
// certificate check and the end-to-end tests read the verdicts; the keys are test keys.
//
//	go run generate.go > certificates.json
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"runtime"
	"strings"
	"time"
)

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

type verdict struct {
	Name        string   `json:"name"`
	Length      int      `json:"length"`
	Certificate string   `json:"certificate,omitempty"`
	Handshake   string   `json:"handshake,omitempty"`
	Verify      string   `json:"verify,omitempty"`
	Accepted    bool     `json:"accepted"`
	User        string   `json:"user,omitempty"`
	Groups      []string `json:"groups,omitempty"`
}

var (
	oidSAN        = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidEKU        = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidKeyUsage   = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidBasic      = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidUnknown    = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 55555, 1}
	ecdsaSHA256   = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}
	ecdsaSHA384   = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 3}
	clientAuthEKU = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}
	serverAuthEKU = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}
)

func marshal(v any) []byte { return must(asn1.Marshal(v)) }

func raw(class, tag int, compound bool, contents []byte) []byte {
	return marshal(asn1.RawValue{Class: class, Tag: tag, IsCompound: compound, Bytes: contents})
}

func seq(parts ...[]byte) []byte { return raw(0, asn1.TagSequence, true, concat(parts...)) }

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// generalNames: a SubjectAltName value of the given [tag] contents.
func san(names ...[]byte) []byte { return seq(names...) }

func name(tag int, contents string) []byte { return raw(2, tag, false, []byte(contents)) }

func extension(oid asn1.ObjectIdentifier, critical bool, value []byte) []byte {
	parts := [][]byte{marshal(oid)}
	if critical {
		parts = append(parts, marshal(true))
	}
	parts = append(parts, raw(0, asn1.TagOctetString, false, value))
	return seq(parts...)
}

func elements(der []byte) []asn1.RawValue {
	var out []asn1.RawValue
	for rest := der; len(rest) > 0; {
		var e asn1.RawValue
		rest = must(asn1.Unmarshal(rest, &e))
		out = append(out, e)
	}
	return out
}

type tbsFields struct {
	version, serial, signature, issuer, validity, subject, key []byte
	extensions                                              [][]byte
}

func main() {
	caKey := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vectors-ca"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER := must(x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey))
	ca := must(x509.ParseCertificate(caDER))
	key := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	template := &x509.Certificate{
		SerialNumber: big.NewInt(4242), Subject: pkix.Name{CommonName: "carol", Organization: []string{"devs"}},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	goodDER := must(x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey))
	tbs := elements(elements(elements(goodDER)[0].Bytes)[0].Bytes)
	good := tbsFields{tbs[0].FullBytes, tbs[1].FullBytes, tbs[2].FullBytes, tbs[3].FullBytes, tbs[4].FullBytes, tbs[5].FullBytes, tbs[6].FullBytes, nil}
	// tbs[7] is [3] { SEQUENCE OF Extension }.
	for _, e := range elements(elements(tbs[7].Bytes)[0].Bytes) {
		good.extensions = append(good.extensions, e.FullBytes)
	}
	sign := func(f tbsFields, outerAlg []byte) []byte {
		exts := concat(f.extensions...)
		body := concat(f.version, f.serial, f.signature, f.issuer, f.validity, f.subject, f.key)
		if len(f.extensions) > 0 {
			body = concat(body, raw(2, 3, true, seq(exts)))
		}
		tbsDER := seq(body)
		digest := sha256.Sum256(tbsDER)
		signature := must(ecdsa.SignASN1(rand.Reader, caKey, digest[:]))
		if outerAlg == nil {
			outerAlg = f.signature
		}
		bits := marshal(asn1.BitString{Bytes: signature, BitLength: len(signature) * 8})
		return seq(tbsDER, outerAlg, bits)
	}
	subject := func(cn string) []byte {
		atv := func(oid asn1.ObjectIdentifier, v string) []byte {
			return raw(0, asn1.TagSet, true, seq(marshal(oid), raw(0, asn1.TagUTF8String, false, []byte(v))))
		}
		return seq(atv(asn1.ObjectIdentifier{2, 5, 4, 10}, "devs"), atv(asn1.ObjectIdentifier{2, 5, 4, 3}, cn))
	}
	with := func(change func(*tbsFields)) []byte {
		f := good
		f.extensions = append([][]byte(nil), good.extensions...)
		change(&f)
		return sign(f, nil)
	}
	addExt := func(e []byte) func(*tbsFields) {
		return func(f *tbsFields) { f.extensions = append(f.extensions, e) }
	}
	sanWith := func(names ...[]byte) func(*tbsFields) { return addExt(extension(oidSAN, false, san(names...))) }
	cases := []struct {
		name string
		der  []byte
	}{
		{"good", with(func(*tbsFields) {})},
		{"serial zero", with(func(f *tbsFields) { f.serial = marshal(big.NewInt(0)) })},
		{"serial negative", with(func(f *tbsFields) { f.serial = marshal(big.NewInt(-5)) })},
		{"serial of 21 bytes", with(func(f *tbsFields) { f.serial = marshal(new(big.Int).Lsh(big.NewInt(1), 160)) })},
		{"serial not minimally encoded", with(func(f *tbsFields) { f.serial = []byte{2, 2, 0, 5} })},
		{"version 4", with(func(f *tbsFields) { f.version = raw(2, 0, true, marshal(3)) })},
		{"inner and outer signature algorithms differ", sign(good, seq(marshal(ecdsaSHA384)))},
		{"SAN dNSName", with(sanWith(name(2, "carol.example")))},
		{"SAN dNSName not ASCII", with(sanWith(name(2, "caf\xc3\xa9.example")))},
		{"SAN dNSName empty", with(sanWith(name(2, "")))},
		{"SAN rfc822Name", with(sanWith(name(1, "carol@example.com")))},
		{"SAN rfc822Name not ASCII", with(sanWith(name(1, "caf\xc3\xa9@example.com")))},
		{"SAN rfc822Name without @", with(sanWith(name(1, "carol")))},
		{"SAN iPAddress of 4 bytes", with(sanWith(name(7, "\x0a\x00\x00\x01")))},
		{"SAN iPAddress of 16 bytes", with(sanWith(name(7, strings.Repeat("\x00", 15)+"\x01")))},
		{"SAN iPAddress of 5 bytes", with(sanWith(name(7, "\x0a\x00\x00\x01\x02")))},
		{"SAN URI", with(sanWith(name(6, "spiffe://cluster/carol")))},
		{"SAN URI not ASCII", with(sanWith(name(6, "https://caf\xc3\xa9.example/")))},
		{"SAN URI that does not parse", with(sanWith(name(6, "http://[::1")))},
		{"SAN URI with an invalid domain", with(sanWith(name(6, "https://a..b/")))},
		{"SAN otherName", with(sanWith(raw(2, 0, true, concat(marshal(asn1.ObjectIdentifier{1, 2, 3}), raw(2, 0, true, marshal("x"))))))},
		{"SAN directoryName", with(sanWith(raw(2, 4, true, subject("x"))))},
		{"SAN empty", with(sanWith())},
		{"SAN not a sequence", with(addExt(extension(oidSAN, false, marshal(5))))},
		{"duplicate extensions", with(func(f *tbsFields) { f.extensions = append(f.extensions, f.extensions[len(f.extensions)-1]) })},
		{"duplicate SAN extensions", with(func(f *tbsFields) {
			e := extension(oidSAN, false, san(name(2, "carol.example")))
			f.extensions = append(f.extensions, e, e)
		})},
		{"critical flag FALSE written out", with(addExt(seq(marshal(oidUnknown), marshal(false), raw(0, asn1.TagOctetString, false, marshal(1)))))},
		{"critical flag not DER (0x01)", with(addExt(seq(marshal(oidUnknown), []byte{1, 1, 1}, raw(0, asn1.TagOctetString, false, marshal(1)))))},
		{"unknown critical extension", with(addExt(extension(oidUnknown, true, marshal(1))))},
		{"unknown extension", with(addExt(extension(oidUnknown, false, marshal(1))))},
		{"key usage not a BIT STRING", with(func(f *tbsFields) {
			for i, e := range f.extensions {
				if strings.Contains(string(e), string(marshal(oidKeyUsage))) {
					f.extensions[i] = extension(oidKeyUsage, true, marshal(5))
				}
			}
		})},
		{"basic constraints not a sequence", with(addExt(extension(oidBasic, true, marshal(5))))},
		{"extended key usage server auth only", with(func(f *tbsFields) {
			for i, e := range f.extensions {
				if strings.Contains(string(e), string(marshal(oidEKU))) {
					f.extensions[i] = extension(oidEKU, false, seq(marshal(serverAuthEKU)))
				}
			}
		})},
		{"extended key usage not a sequence", with(func(f *tbsFields) {
			for i, e := range f.extensions {
				if strings.Contains(string(e), string(marshal(oidEKU))) {
					f.extensions[i] = extension(oidEKU, false, marshal(5))
				}
			}
		})},
		{"CN of 60,000 bytes", with(func(f *tbsFields) { f.subject = subject(strings.Repeat("c", 60000)) })},
		{"CN of 70,000 bytes", with(func(f *tbsFields) { f.subject = subject(strings.Repeat("c", 70000)) })},
		{"CN of 300,000 bytes", with(func(f *tbsFields) { f.subject = subject(strings.Repeat("c", 300000)) })},
	}
	_ = clientAuthEKU
	_ = ecdsaSHA256
	serverKey := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	serverTemplate := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "server"}, NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0), DNSNames: []string{"server"}}
	serverDER := must(x509.CreateCertificate(rand.Reader, serverTemplate, ca, &serverKey.PublicKey, caKey))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	var out []verdict
	for _, c := range cases {
		v := verdict{Name: c.name, Length: len(c.der)}
		// The largest is described, not kept: its size is the point (core's tests make one).
		if len(c.der) <= 100000 {
			v.Certificate = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der}))
		}
		// kube-apiserver's TLS server asks for a client certificate and verifies it afterwards.
		listener := must(net.Listen("tcp", "127.0.0.1:0"))
		clientSide := must(net.Dial("tcp", listener.Addr().String()))
		serverSide := must(listener.Accept())
		listener.Close()
		server := tls.Server(serverSide, &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}},
			ClientAuth:   tls.RequestClientCert,
		})
		client := tls.Client(clientSide, &tls.Config{
			InsecureSkipVerify: true,
			Certificates:       []tls.Certificate{{Certificate: [][]byte{c.der}, PrivateKey: key}},
		})
		done := make(chan error, 1)
		go func() { done <- client.Handshake(); clientSide.Close() }()
		err := server.Handshake()
		serverSide.Close()
		<-done
		if err != nil {
			v.Handshake = err.Error()
		} else if peers := server.ConnectionState().PeerCertificates; len(peers) != 1 {
			v.Handshake = fmt.Sprintf("%d peer certificates", len(peers))
		} else {
			_, err := peers[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			if err != nil {
				v.Verify = err.Error()
			} else {
				v.Accepted, v.User, v.Groups = true, peers[0].Subject.CommonName, peers[0].Subject.Organization
			}
		}
		out = append(out, v)
	}
	document := map[string]any{
		"go":       runtime.Version(),
		"ca":       string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		"key":      string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: must(x509.MarshalPKCS8PrivateKey(key))})),
		"verdicts": out,
	}
	fmt.Println(string(must(json.MarshalIndent(document, "", " "))))
}
