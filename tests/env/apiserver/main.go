// Command apiserver runs a real kube-apiserver backed by an embedded etcd in one
// process, bound to 127.0.0.1 only, with RBAC authorization on. It writes an admin
// kubeconfig once the server answers /readyz and stops cleanly on SIGTERM or SIGINT.
//
// It exists so haptic's integration tests talk to the genuine Kubernetes API server
// (admission, RBAC, status subresources, watches) without a cluster or containers.
//
// The same binary runs kube-controller-manager or kube-scheduler of the same Kubernetes
// build when its first argument names one (`controller-manager ...`, `scheduler ...`, their
// own flags after it): the environment's cluster mode, where Deployments become Pods.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

type launcherConfig struct {
	dataDir        string
	securePort     int
	kubeconfigPath string
	readyTimeout   time.Duration
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "controller-manager":
			runComponent(controllermanager.NewControllerManagerCommand(), os.Args[2:])
			return
		case "scheduler":
			runComponent(scheduler.NewSchedulerCommand(), os.Args[2:])
			return
		}
	}
	cfg := launcherConfig{}
	flag.StringVar(&cfg.dataDir, "data-dir", "", "directory for etcd data, certificates and the kubeconfig (required)")
	flag.IntVar(&cfg.securePort, "secure-port", 0, "HTTPS port on 127.0.0.1 (0 picks a free one)")
	flag.StringVar(&cfg.kubeconfigPath, "kubeconfig", "", "where to write the admin kubeconfig (default <data-dir>/kubeconfig)")
	flag.DurationVar(&cfg.readyTimeout, "ready-timeout", 120*time.Second, "how long to wait for /readyz")
	flag.Parse()
	if cfg.dataDir == "" {
		fatalf("--data-dir is required")
	}
	if cfg.kubeconfigPath == "" {
		cfg.kubeconfigPath = filepath.Join(cfg.dataDir, "kubeconfig")
	}
	if err := run(cfg); err != nil {
		fatalf("%v", err)
	}
}

// runComponent runs another component of the same Kubernetes build with its own flags; it
// stops on SIGTERM or SIGINT as the component itself handles them.
func runComponent(command interface {
	SetArgs([]string)
	Execute() error
}, args []string) {
	command.SetArgs(args)
	if err := command.Execute(); err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "apiserver launcher: "+format+"\n", args...)
	os.Exit(1)
}

func run(cfg launcherConfig) error {
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return fmt.Errorf("creating data dir %s: %w", cfg.dataDir, err)
	}
	// A stale kubeconfig would tell a waiting caller the server is up before it is.
	_ = os.Remove(cfg.kubeconfigPath)

	if cfg.securePort == 0 {
		port, err := freePort()
		if err != nil {
			return err
		}
		cfg.securePort = port
	} else if err := checkPortFree(cfg.securePort); err != nil {
		return err
	}

	pki, err := writePKI(filepath.Join(cfg.dataDir, "pki"))
	if err != nil {
		return fmt.Errorf("generating certificates: %w", err)
	}

	etcd, etcdURL, err := startEtcd(filepath.Join(cfg.dataDir, "etcd"))
	if err != nil {
		return fmt.Errorf("starting embedded etcd: %w", err)
	}
	defer etcd.Close()

	// kube-apiserver installs its own SIGTERM/SIGINT handler that cancels its context
	// and makes the command return; we then stop etcd and exit 0.
	cmd := app.NewAPIServerCommand()
	cmd.SetArgs(apiserverArgs(cfg, pki, etcdURL))
	serverDone := make(chan error, 1)
	go func() { serverDone <- cmd.Execute() }()

	ready := make(chan error, 1)
	go func() { ready <- waitReady(cfg, pki) }()

	// Our own notification only so a signal before readiness does not race the kubeconfig write.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	for {
		select {
		case err := <-ready:
			if err != nil {
				return err
			}
			if err := writeKubeconfig(cfg, pki); err != nil {
				return err
			}
			fmt.Printf("apiserver ready: https://127.0.0.1:%d kubeconfig=%s\n", cfg.securePort, cfg.kubeconfigPath)
			ready = nil
		case err := <-serverDone:
			if err != nil {
				return fmt.Errorf("kube-apiserver exited: %w", err)
			}
			fmt.Println("apiserver stopped")
			return nil
		case sig := <-signals:
			// The server got the same signal; give it time to drain, then stop regardless.
			fmt.Printf("apiserver launcher: %s received, shutting down\n", sig)
			select {
			case <-serverDone:
			case <-time.After(20 * time.Second):
				fmt.Fprintln(os.Stderr, "apiserver launcher: kube-apiserver did not stop within 20s")
			}
			_ = os.Remove(cfg.kubeconfigPath)
			return nil
		case <-etcd.Err():
			return errors.New("embedded etcd failed")
		}
	}
}

func apiserverArgs(cfg launcherConfig, pki pkiFiles, etcdURL string) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(cfg.securePort),
		"--tls-cert-file=" + pki.serverCert,
		"--tls-private-key-file=" + pki.serverKey,
		"--client-ca-file=" + pki.caCert,
		"--token-auth-file=" + pki.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + pki.serviceAccountKey,
		"--service-account-signing-key-file=" + pki.serviceAccountKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller manager runs, so no namespace ever gets its "default" ServiceAccount;
		// the ServiceAccount admission plugin would then refuse every Pod.
		"--disable-admission-plugins=ServiceAccount",
		"--cert-dir=" + filepath.Join(cfg.dataDir, "pki"),
		// The cluster mode's kubelet (tests/env/kubelet.py) gives its Node an InternalIP only;
		// the default order would try its hostname first, through DNS.
		"--kubelet-preferred-address-types=InternalIP",
		"--v=0",
	}
}

func waitReady(cfg launcherConfig, pki pkiFiles) error {
	caPEM, err := os.ReadFile(pki.caCert)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	deadline := time.Now().Add(cfg.readyTimeout)
	readyURL := fmt.Sprintf("https://127.0.0.1:%d/readyz", cfg.securePort)
	lastStatus := "no answer"
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, readyURL, nil)
		req.Header.Set("Authorization", "Bearer "+pki.adminToken)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			lastStatus = resp.Status
		} else {
			lastStatus = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver did not answer %s with 200 within %s (last: %s)", readyURL, cfg.readyTimeout, lastStatus)
}

func startEtcd(dir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}

	ecfg := embed.NewConfig()
	ecfg.Name = "haptic-testenv"
	ecfg.Dir = dir
	ecfg.ListenClientUrls = []url.URL{clientURL}
	ecfg.AdvertiseClientUrls = []url.URL{clientURL}
	ecfg.ListenPeerUrls = []url.URL{peerURL}
	ecfg.AdvertisePeerUrls = []url.URL{peerURL}
	ecfg.InitialCluster = fmt.Sprintf("%s=%s", ecfg.Name, peerURL.String())
	// Test data is thrown away; fsync only costs time.
	ecfg.UnsafeNoFsync = true
	ecfg.LogLevel = "error"

	etcd, err := embed.StartEtcd(ecfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		etcd.Close()
		return nil, "", errors.New("embedded etcd not ready within 60s")
	}
	return etcd, clientURL.String(), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func checkPortFree(port int) error {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("port 127.0.0.1:%d is in use; stop what holds it or pass another --secure-port: %w", port, err)
	}
	return l.Close()
}

type pkiFiles struct {
	caCert            string
	serverCert        string
	serverKey         string
	serviceAccountKey string
	tokenFile         string
	adminToken        string
}

func writePKI(dir string) (pkiFiles, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return pkiFiles{}, err
	}
	files := pkiFiles{
		caCert:            filepath.Join(dir, "ca.crt"),
		serverCert:        filepath.Join(dir, "server.crt"),
		serverKey:         filepath.Join(dir, "server.key"),
		serviceAccountKey: filepath.Join(dir, "service-account.key"),
		tokenFile:         filepath.Join(dir, "tokens.csv"),
	}
	// A restart on the same data dir keeps its certificates and token, so clients that were
	// connected before (a controller under test, say) can reconnect.
	if token, err := os.ReadFile(files.tokenFile); err == nil {
		if _, err := os.Stat(files.serverKey); err == nil {
			files.adminToken = strings.SplitN(string(token), ",", 2)[0]
			return files, nil
		}
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "haptic-testenv-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return files, err
	}
	caParsed, err := x509.ParseCertificate(caDER)
	if err != nil {
		return files, err
	}

	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, err
	}
	serverTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, serverTemplate, caParsed, &serverKey.PublicKey, caKey)
	if err != nil {
		return files, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return files, err
	}

	tokenBytes := make([]byte, 24)
	if _, err := rand.Read(tokenBytes); err != nil {
		return files, err
	}
	files.adminToken = hex.EncodeToString(tokenBytes)

	serverKeyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return files, err
	}
	writes := []struct {
		path string
		data []byte
	}{
		{files.caCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})},
		{files.serverCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serverDER})},
		{files.serverKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: serverKeyDER})},
		{files.serviceAccountKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})},
		{files.tokenFile, []byte(files.adminToken + ",admin,admin-uid,\"system:masters\"\n")},
	}
	for _, w := range writes {
		if err := os.WriteFile(w.path, w.data, 0o600); err != nil {
			return files, err
		}
	}
	return files, nil
}

func writeKubeconfig(cfg launcherConfig, pki pkiFiles) error {
	caPEM, err := os.ReadFile(pki.caCert)
	if err != nil {
		return err
	}
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: haptic-testenv
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: haptic-testenv
  context:
    cluster: haptic-testenv
    user: admin
current-context: haptic-testenv
`, cfg.securePort, base64.StdEncoding.EncodeToString(caPEM), pki.adminToken)
	// Write then rename, so a reader polling for the file never sees half of it.
	tmp := cfg.kubeconfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, cfg.kubeconfigPath)
}
