/* cuda: (to be written) */
