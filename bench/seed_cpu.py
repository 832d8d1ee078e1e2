"""The seed's ``cifar10-cpu.py`` (wiki section "Travailler avec un CPU"), copied as is.

Changes, each marked ``# bench:``: the dataset comes from ``verified_cifar10`` (our
manifest instead of torchvision's official md5s, which synthetic data cannot match) at
``--data`` instead of ``CIFAR10(root='./data')``, and the throughput is printed at the end
(the seed computes ``perf`` and ``total_time`` but never prints them).
"""
import numpy as np
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import torchvision
import torchvision.transforms as transforms
from torchvision.datasets import CIFAR10
from torch.utils.data import DataLoader

import argparse
import os
import json  # bench
import sys  # bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))  # bench
from cifarflow.engine.loaders import verified_cifar10  # bench

parser = argparse.ArgumentParser(description='cifar10 classification models, cpu performance test')
parser.add_argument('--lr', default=0.1, help='')
parser.add_argument('--batch_size', type=int, default=512, help='')
parser.add_argument('--num_workers', type=int, default=0, help='')
parser.add_argument('--data', default='./data/cifar-10-batches-py', help='')  # bench

def main():

    args = parser.parse_args()
    torch.set_num_threads(int(os.environ['SLURM_CPUS_PER_TASK']))
    class Net(nn.Module):

       def __init__(self):
          super(Net, self).__init__()

          self.conv1 = nn.Conv2d(3, 6, 5)
          self.pool = nn.MaxPool2d(2, 2)
          self.conv2 = nn.Conv2d(6, 16, 5)
          self.fc1 = nn.Linear(16 * 5 * 5, 120)
          self.fc2 = nn.Linear(120, 84)
          self.fc3 = nn.Linear(84, 10)

       def forward(self, x):
          x = self.pool(F.relu(self.conv1(x)))
          x = self.pool(F.relu(self.conv2(x)))
          x = x.view(-1, 16 * 5 * 5)
          x = F.relu(self.fc1(x))
          x = F.relu(self.fc2(x))
          x = F.relu(self.fc3(x))
          return x

    net = Net()

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=args.lr)

    transform_train = transforms.Compose([transforms.ToTensor(),transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])

    # bench: was CIFAR10(root='./data', train=True, download=False, transform=transform_train)
    dataset_train = verified_cifar10(args.data, True, transform_train)

    train_loader = DataLoader(dataset_train, batch_size=args.batch_size, num_workers=args.num_workers)

    perf = []

    total_start = time.time()

    for batch_idx, (inputs, targets) in enumerate(train_loader):

       start = time.time()

       outputs = net(inputs)
       loss = criterion(outputs, targets)

       optimizer.zero_grad()
       loss.backward()
       optimizer.step()

       batch_time = time.time() - start

       images_per_sec = args.batch_size/batch_time

       perf.append(images_per_sec)

    total_time = time.time() - total_start

    # bench: report what the seed measured
    result = {"images": len(dataset_train), "total_time_s": total_time,
              "images_per_sec": len(dataset_train) / total_time,
              "perf_mean": float(np.mean(perf)), "batches": len(perf)}
    print(f"seed: {result['images']} images in {total_time:.2f} s = "
          f"{result['images_per_sec']:,.0f} img/s (end to end, data loading included); "
          f"mean of per-batch perf {result['perf_mean']:,.0f} img/s (the seed's own metric: "
          "compute only, excludes data loading)")
    print("BENCH_RESULT " + json.dumps(result))

if __name__=='__main__':
   main()
