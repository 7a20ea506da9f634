// Writes go-verdicts.json: for one name attribute value (its ASN.1 tag and contents) in a
// certificate's issuer or subject, whether Go's crypto/x509 parses the certificate, as
// kube-apiserver does every client certificate. core/src/certificate.rs checks its own reading
// against these verdicts.
//
//	go run generate.go > go-verdicts.json
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"runtime"
	"strings"
	"time"
)

type verdict struct {
	Name      string `json:"name"`
	Attribute string `json:"attribute"`
	Tag       int    `json:"tag"`
	Contents  string `json:"contents"`
	Accepted  bool   `json:"accepted"`
	Error     string `json:"error,omitempty"`
}

var attributes = map[string]asn1.ObjectIdentifier{
	"CN": {2, 5, 4, 3},
	"O":  {2, 5, 4, 10},
	"OU": {2, 5, 4, 11},
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func main() {
	key := must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "x"},
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Unix(1<<32, 0),
	}
	der := must(x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key))
	var certificate []asn1.RawValue
	var outer asn1.RawValue
	must(asn1.Unmarshal(der, &outer))
	for rest := outer.Bytes; len(rest) > 0; {
		var element asn1.RawValue
		rest = must(asn1.Unmarshal(rest, &element))
		certificate = append(certificate, element)
	}
	var tbs []asn1.RawValue
	for rest := certificate[0].Bytes; len(rest) > 0; {
		var element asn1.RawValue
		rest = must(asn1.Unmarshal(rest, &element))
		tbs = append(tbs, element)
	}
	// version, serial, signature, issuer (3), validity, subject (5), key.
	tags := []int{2, 4, 5, 12, 18, 19, 20, 21, 22, 25, 26, 27, 28, 30, 12 | 0x20, 0x80}
	contents := []string{
		"admin", "", "a*b&", "a_b", "a@b", "(x)+,-./:=?' ", "12 34", "12a", "caf\xc3\xa9", "\xff", "\x7f",
		"\x00a\x00d", "\x00a\x00d\x00\x00", "\xd8\x00\x00a", "\xff\xfe", "\xfd\xd0", "\x00a\x00", "\x00\x00\x00a",
	}
	var out []verdict
	for _, name := range []string{"issuer", "subject"} {
		for _, attribute := range []string{"CN", "O", "OU"} {
			if name == "issuer" && attribute != "CN" {
				continue
			}
			for _, tag := range tags {
				for _, c := range contents {
					value := asn1.RawValue{Class: tag >> 6, Tag: tag & 0x1f, IsCompound: tag&0x20 != 0, Bytes: []byte(c)}
					atv := must(asn1.Marshal(struct {
						Type  asn1.ObjectIdentifier
						Value asn1.RawValue
					}{attributes[attribute], value}))
					set := must(asn1.Marshal(asn1.RawValue{Tag: asn1.TagSet, IsCompound: true, Bytes: atv}))
					rdns := must(asn1.Marshal(asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: set}))
					fields := append([]asn1.RawValue(nil), tbs...)
					at := map[string]int{"issuer": 3, "subject": 5}[name]
					fields[at] = asn1.RawValue{FullBytes: rdns}
					var body []byte
					for _, f := range fields {
						body = append(body, must(asn1.Marshal(f))...)
					}
					newTbs := must(asn1.Marshal(asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: body}))
					var all []byte
					all = append(all, newTbs...)
					for _, f := range certificate[1:] {
						all = append(all, must(asn1.Marshal(f))...)
					}
					cert := must(asn1.Marshal(asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: all}))
					v := verdict{Name: name, Attribute: attribute, Tag: tag, Contents: hex.EncodeToString([]byte(c))}
					if _, err := x509.ParseCertificate(cert); err != nil {
						if !strings.Contains(err.Error(), "RDNSequence") {
							panic(fmt.Sprintf("%s %s tag %d %q: not refused for its name: %v", name, attribute, tag, c, err))
						}
						v.Error = err.Error()
					} else {
						v.Accepted = true
					}
					out = append(out, v)
				}
			}
		}
	}
	fmt.Printf("{\"go\": %q, \"verdicts\": [\n", runtime.Version())
	for i, v := range out {
		line := must(json.Marshal(v))
		sep := ","
		if i == len(out)-1 {
			sep = ""
		}
		fmt.Printf("%s%s\n", line, sep)
	}
	fmt.Println("]}")
}
