// Command localkube is a single binary that runs a small but real Kubernetes
// control plane for agentrun's tests and `make dev`:
//
//	localkube etcd ...               embedded etcd (go.etcd.io/etcd/server/v3/embed)
//	localkube apiserver ...          k8s.io/kubernetes/cmd/kube-apiserver/app
//	localkube controller-manager ... k8s.io/kubernetes/cmd/kube-controller-manager/app
//	localkube kubectl ...            k8s.io/kubectl/pkg/cmd (version-matched kubectl)
//	localkube up --dir DIR           supervisor: certs, token file, kubeconfigs,
//	                                 starts the three components as child
//	                                 processes, waits for /readyz.
//	localkube version
//
// When invoked through a file or symlink named "kubectl", it behaves as kubectl.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func usage() {
	fmt.Fprintf(os.Stderr, `usage: localkube <command> [flags]

commands:
  up --dir DIR         start etcd, kube-apiserver, kube-controller-manager (supervised)
  etcd                 run embedded etcd
  apiserver            run kube-apiserver (all kube-apiserver flags)
  controller-manager   run kube-controller-manager (all its flags)
  kubectl              run kubectl
  version              print the Kubernetes version compiled in
`)
}

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		runKubectl()
		return
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	sub := os.Args[1]
	// Make the sub-command look like its own program for cobra and for
	// kubectl's plugin handler, which both inspect os.Args.
	os.Args = append([]string{sub}, os.Args[2:]...)
	switch sub {
	case "up":
		os.Exit(runUp(os.Args[1:]))
	case "etcd":
		os.Exit(runEtcd(os.Args[1:]))
	case "apiserver", "kube-apiserver":
		os.Exit(cli.Run(apiserverapp.NewAPIServerCommand()))
	case "controller-manager", "kube-controller-manager":
		os.Exit(cli.Run(kcmapp.NewControllerManagerCommand()))
	case "kubectl":
		runKubectl()
	case "version", "--version":
		fmt.Println(version.Get().GitVersion)
	case "-h", "--help", "help":
		usage()
	default:
		usage()
		os.Exit(2)
	}
}

func runKubectl() {
	os.Args[0] = "kubectl"
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	os.Exit(0)
}
