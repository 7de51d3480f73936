package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// state is written to DIR/cluster.json once the control plane is ready.
type state struct {
	Server          string         `json:"server"`
	Kubeconfig      string         `json:"kubeconfig"`
	AdminToken      string         `json:"admin_token"`
	CAFile          string         `json:"ca_file"`
	BinDir          string         `json:"bin_dir"`
	EtcdURL         string         `json:"etcd_url"`
	SupervisorPID   int            `json:"supervisor_pid"`
	PIDs            map[string]int `json:"pids"`
	Ports           map[string]int `json:"ports"`
	Version         string         `json:"version"`
	ServiceCIDR     string         `json:"service_cidr"`
	ServiceAccounts string         `json:"service_account_issuer"`
}

type child struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

const (
	serviceCIDR = "10.96.0.0/16"
	saIssuer    = "https://kubernetes.default.svc.cluster.local"
	// Controllers enabled in kube-controller-manager. No scheduler, no node
	// lifecycle (the process kubelet is the only node and never taints),
	// no cloud, no volumes.
	controllers = "job-controller,cronjob-controller,garbage-collector-controller," +
		"namespace-controller,ttl-after-finished-controller,serviceaccount-controller," +
		"serviceaccount-token-controller,root-ca-certificate-publisher-controller," +
		"replicaset-controller,deployment-controller,pod-garbage-collector-controller," +
		"resourcequota-controller,disruption-controller,clusterrole-aggregation-controller"
)

func runUp(args []string) int {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", ".localkube", "cluster directory (certs, etcd data, logs, kubeconfigs)")
	port := fs.Int("port", 0, "apiserver secure port (0 = pick a free one)")
	timeout := fs.Duration("timeout", 180*time.Second, "how long to wait for /readyz")
	fresh := fs.Bool("fresh", false, "delete etcd data before starting")
	verbosity := fs.Int("v", 0, "klog verbosity for apiserver/controller-manager")
	_ = fs.Parse(args)

	d, err := filepath.Abs(*dir)
	if err != nil {
		return fail("dir: %v", err)
	}
	if err := up(d, *port, *timeout, *fresh, *verbosity); err != nil {
		fmt.Fprintln(os.Stderr, "localkube up:", err)
		return 1
	}
	return 0
}

func fail(f string, a ...any) int {
	fmt.Fprintf(os.Stderr, "localkube up: "+f+"\n", a...)
	return 1
}

func up(dir string, apiPort int, timeout time.Duration, fresh bool, verbosity int) error {
	for _, sub := range []string{"pki", "logs", "bin", "etcd"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(dir, "ready"))
	_ = os.Remove(filepath.Join(dir, "cluster.json"))
	if fresh {
		_ = os.RemoveAll(filepath.Join(dir, "etcd"))
		_ = os.MkdirAll(filepath.Join(dir, "etcd"), 0o700)
	}
	_ = os.Chmod(filepath.Join(dir, "etcd"), 0o700)
	pki := filepath.Join(dir, "pki")
	if err := ensurePKI(pki); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	tokens, err := ensureTokens(pki)
	if err != nil {
		return fmt.Errorf("tokens: %w", err)
	}

	ports, err := choosePorts(filepath.Join(dir, "ports.json"), apiPort)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	self, _ = filepath.EvalSymlinks(self)

	// version-matched kubectl for the cluster's bin dir
	kubectl := filepath.Join(dir, "bin", "kubectl")
	_ = os.Remove(kubectl)
	if err := os.Symlink(self, kubectl); err != nil {
		return err
	}
	lk := filepath.Join(dir, "bin", "localkube")
	_ = os.Remove(lk)
	_ = os.Symlink(self, lk)

	server := fmt.Sprintf("https://127.0.0.1:%d", ports["apiserver"])
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports["etcd-client"])
	caFile := filepath.Join(pki, "ca.crt")
	adminKC := filepath.Join(dir, "admin.kubeconfig")
	kcmKC := filepath.Join(dir, "controller-manager.kubeconfig")
	if err := writeKubeconfig(adminKC, server, caFile, "admin", tokens["admin"]); err != nil {
		return err
	}
	if err := writeKubeconfig(kcmKC, server, caFile, "system:kube-controller-manager", tokens["kcm"]); err != nil {
		return err
	}

	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	var children []*child
	stopAll := func() {
		for i := len(children) - 1; i >= 0; i-- {
			stopChild(children[i], 15*time.Second)
		}
		_ = os.Remove(filepath.Join(dir, "ready"))
	}

	start := func(name string, args ...string) (*child, error) {
		logf, err := os.OpenFile(filepath.Join(dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(self, args...)
		cmd.Stdout = logf
		cmd.Stderr = logf
		cmd.Dir = dir
		// Die with the supervisor even if it is SIGKILLed.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		c := &child{name: name, cmd: cmd, done: make(chan error, 1)}
		go func() { c.done <- cmd.Wait(); logf.Close() }()
		children = append(children, c)
		fmt.Fprintf(os.Stderr, "localkube: started %s pid %d (log %s)\n", name, cmd.Process.Pid, logf.Name())
		return c, nil
	}

	// wait runs check until it succeeds, a child dies, a signal arrives, or timeout.
	wait := func(what string, check func() error) error {
		deadline := time.Now().Add(timeout)
		var last error
		for time.Now().Before(deadline) {
			if last = check(); last == nil {
				return nil
			}
			for _, c := range children {
				select {
				case err := <-c.done:
					c.done <- err
					return fmt.Errorf("%s exited while waiting for %s: %v (see %s)", c.name, what, err,
						filepath.Join(dir, "logs", c.name+".log"))
				default:
				}
			}
			select {
			case s := <-sig:
				return fmt.Errorf("got %v while waiting for %s", s, what)
			case <-time.After(250 * time.Millisecond):
			}
		}
		return fmt.Errorf("timed out after %v waiting for %s: %v", timeout, what, last)
	}

	t0 := time.Now()
	etcd, err := start("etcd", "etcd",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-url", etcdURL,
		"--listen-peer-url", fmt.Sprintf("http://127.0.0.1:%d", ports["etcd-peer"]))
	if err != nil {
		stopAll()
		return err
	}
	_ = etcd
	if err := wait("etcd /health", func() error { return httpOK(etcdURL+"/health", nil) }); err != nil {
		stopAll()
		return err
	}

	api, err := start("apiserver", "apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports["apiserver"]),
		"--cert-dir="+pki,
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+caFile,
		"--token-auth-file="+filepath.Join(pki, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer="+saIssuer,
		"--service-account-key-file="+filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--api-audiences="+saIssuer,
		"--service-cluster-ip-range="+serviceCIDR,
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--disable-admission-plugins=TaintNodesByCondition,DefaultStorageClass,DefaultIngressClass,PersistentVolumeClaimResize,StorageObjectInUseProtection",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--event-ttl=1h",
		"--v="+strconv.Itoa(verbosity),
	)
	if err != nil {
		stopAll()
		return err
	}
	_ = api
	ca, err := os.ReadFile(caFile)
	if err != nil {
		stopAll()
		return err
	}
	if err := wait("kube-apiserver /readyz", func() error {
		return httpOK(server+"/readyz", &authInfo{ca: ca, token: tokens["admin"]})
	}); err != nil {
		stopAll()
		return err
	}

	kcm, err := start("controller-manager", "controller-manager",
		"--kubeconfig="+kcmKC,
		"--controllers="+controllers,
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--root-ca-file="+caFile,
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--secure-port=0",
		"--cluster-name=agentrun-local",
		"--service-cluster-ip-range="+serviceCIDR,
		"--concurrent-job-syncs=20",
		"--concurrent-gc-syncs=20",
		"--v="+strconv.Itoa(verbosity),
	)
	if err != nil {
		stopAll()
		return err
	}
	_ = kcm
	// Give the controller-manager a moment to either crash on bad flags or settle.
	if err := wait("kube-controller-manager startup", func() error {
		if time.Since(t0) < 0 {
			return errors.New("never")
		}
		return nil
	}); err != nil {
		stopAll()
		return err
	}

	pids := map[string]int{}
	for _, c := range children {
		pids[c.name] = c.cmd.Process.Pid
	}
	st := state{
		Server:          server,
		Kubeconfig:      adminKC,
		AdminToken:      tokens["admin"],
		CAFile:          caFile,
		BinDir:          filepath.Join(dir, "bin"),
		EtcdURL:         etcdURL,
		SupervisorPID:   os.Getpid(),
		PIDs:            pids,
		Ports:           ports,
		Version:         versionString(),
		ServiceCIDR:     serviceCIDR,
		ServiceAccounts: saIssuer,
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "cluster.json"), b, 0o600); err != nil {
		stopAll()
		return err
	}
	env := fmt.Sprintf("export KUBECONFIG=%s\nexport PATH=%s:$PATH\n", adminKC, st.BinDir)
	_ = os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "localkube.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "ready"), []byte(time.Now().Format(time.RFC3339)+"\n"), 0o644)
	fmt.Fprintf(os.Stderr, "localkube: control plane %s ready at %s in %.1fs\n", st.Version, server, time.Since(t0).Seconds())
	fmt.Print(env)

	// Supervise: any child exiting is fatal (loud), a signal stops everything.
	cases := make(chan *child, len(children))
	for _, c := range children {
		go func(c *child) {
			err := <-c.done
			c.done <- err
			cases <- c
		}(c)
	}
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "localkube: got %v, stopping\n", s)
		stopAll()
		return nil
	case c := <-cases:
		err := <-c.done
		c.done <- err
		stopAll()
		return fmt.Errorf("%s exited unexpectedly: %v (see %s)", c.name, err, filepath.Join(dir, "logs", c.name+".log"))
	}
}

func stopChild(c *child, grace time.Duration) {
	select {
	case err := <-c.done:
		c.done <- err
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		c.done <- err
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		err := <-c.done
		c.done <- err
	}
}

func versionString() string {
	out, err := exec.Command("/proc/self/exe", "version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

type authInfo struct {
	ca    []byte
	token string
}

func httpOK(u string, a *authInfo) error {
	tr := &http.Transport{}
	if a != nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(a.ca)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
	if a != nil && a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: HTTP %d", u, resp.StatusCode)
	}
	return nil
}

// choosePorts keeps the ports from a previous run (so the etcd member's peer
// URL stays stable) when they are still free, otherwise picks free ones.
func choosePorts(file string, apiPort int) (map[string]int, error) {
	ports := map[string]int{}
	if b, err := os.ReadFile(file); err == nil {
		_ = json.Unmarshal(b, &ports)
	}
	if apiPort != 0 {
		ports["apiserver"] = apiPort
	}
	for _, name := range []string{"apiserver", "etcd-client", "etcd-peer"} {
		if p, ok := ports[name]; ok && p > 0 && portFree(p) {
			continue
		}
		if name == "apiserver" && apiPort != 0 {
			return nil, fmt.Errorf("apiserver port %d is in use", apiPort)
		}
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[name] = p
	}
	b, _ := json.Marshal(ports)
	return ports, os.WriteFile(file, b, 0o644)
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func writeKubeconfig(path, server, caFile, user, token string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: localkube
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: localkube
  context:
    cluster: localkube
    user: %s
    namespace: default
current-context: localkube
`, server, b64(ca), user, token, user)
	return os.WriteFile(path, []byte(kc), 0o600)
}

func ensureTokens(pki string) (map[string]string, error) {
	path := filepath.Join(pki, "tokens.csv")
	tokens := map[string]string{}
	if b, err := os.ReadFile(path); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.SplitN(line, ",", 4)
			if len(f) < 3 {
				continue
			}
			switch f[1] {
			case "admin":
				tokens["admin"] = f[0]
			case "system:kube-controller-manager":
				tokens["kcm"] = f[0]
			}
		}
		if tokens["admin"] != "" && tokens["kcm"] != "" {
			return tokens, nil
		}
	}
	for _, k := range []string{"admin", "kcm"} {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		tokens[k] = hex.EncodeToString(b)
	}
	csv := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,system:kube-controller-manager,kcm-uid\n",
		tokens["admin"], tokens["kcm"])
	return tokens, os.WriteFile(path, []byte(csv), 0o600)
}

// ensurePKI writes (once) a CA, an apiserver serving cert signed by it and the
// service-account signing key pair.
func ensurePKI(dir string) error {
	need := []string{"ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub"}
	all := true
	for _, n := range need {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			all = false
		}
	}
	if all {
		return nil
	}
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localkube-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1"), net.IPv6loopback},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt":        pemBytes("CERTIFICATE", caDER),
		"ca.key":        pemBytes("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(caKey)),
		"apiserver.crt": append(pemBytes("CERTIFICATE", srvDER), pemBytes("CERTIFICATE", caDER)...),
		"apiserver.key": pemBytes("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(srvKey)),
		"sa.key":        pemBytes("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)),
		"sa.pub":        pemBytes("PUBLIC KEY", saPub),
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func pemBytes(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
